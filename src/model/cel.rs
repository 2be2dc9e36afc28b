//! The CEL subset that DRA device selectors use, evaluated against one device.
//!
//! DeviceClasses and ResourceClaims select devices with CEL expressions over `device.driver`,
//! `device.attributes["domain"].name` and `device.capacity["domain"].name` (Kubernetes's
//! `k8s.io/dynamic-resource-allocation/cel`). No maintained Rust CEL crate offers Kubernetes's
//! `quantity()` and `semver()` value types as receivers of `compareTo`/`isGreaterThan`, and the
//! decision core stays free of a generated parser, so this is a small parser and evaluator with
//! CEL's semantics where selectors meet them: `&&`/`||` absorb an error when the other side
//! decides (CEL's commutative logic), a missing attribute is a runtime error (not `false`),
//! `has()` tests presence, `in` works on lists and maps, `matches` is RE2-style (the `regex`
//! crate), integers do not compare with strings. Anything outside the subset fails to parse,
//! so an expression is either evaluated as Kubernetes would or rejected with the reason: never
//! a silent match.

use std::collections::BTreeMap;
use std::fmt;

/// A typed attribute value a device publishes (`resource.k8s.io/v1` `DeviceAttribute`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum AttrValue {
    /// `int`.
    Int(i64),
    /// `bool`.
    Bool(bool),
    /// `string`.
    Str(String),
    /// `version` (semantic version).
    Version(Semver),
}

/// A semantic version, compared by major, minor, patch, then pre-release (a pre-release sorts
/// before the release, as semver orders them).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Semver {
    /// Major, minor, patch.
    pub core: (u64, u64, u64),
    /// Pre-release, empty for none.
    pub pre: String,
}

impl Semver {
    /// Parses `1.2.3`, `1.2.3-rc.1`, `1.2.3+build` (build metadata ignored, as semver does).
    pub fn parse(s: &str) -> Option<Semver> {
        let s = s.split('+').next()?;
        let (core, pre) = match s.split_once('-') {
            Some((c, p)) if !p.is_empty() => (c, p.to_string()),
            Some(_) => return None,
            None => (s, String::new()),
        };
        let parts: Vec<u64> = core
            .split('.')
            .map(|p| if p.is_empty() || (p.len() > 1 && p.starts_with('0')) { None } else { p.parse().ok() })
            .collect::<Option<_>>()?;
        match parts[..] {
            [a, b, c] => Some(Semver { core: (a, b, c), pre }),
            _ => None,
        }
    }
}

impl PartialOrd for Semver {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Semver {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.core.cmp(&other.core).then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => std::cmp::Ordering::Equal,
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            (false, false) => self.pre.cmp(&other.pre),
        })
    }
}

impl fmt::Display for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c) = self.core;
        write!(f, "{a}.{b}.{c}")?;
        if !self.pre.is_empty() {
            write!(f, "-{}", self.pre)?;
        }
        Ok(())
    }
}

/// Parses a Kubernetes quantity (`80Gi`, `500m`, `1.5`, `2e3`) into nano-units, exactly.
pub fn parse_quantity_nanos(s: &str) -> Option<i128> {
    let s = s.trim();
    let split =
        s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let (mult_num, mult_den, exp10): (i128, i128, i32) = match suffix {
        "" => (1, 1, 0),
        "n" => (1, 1, -9),
        "u" => (1, 1, -6),
        "m" => (1, 1, -3),
        "k" => (1, 1, 3),
        "M" => (1, 1, 6),
        "G" => (1, 1, 9),
        "T" => (1, 1, 12),
        "P" => (1, 1, 15),
        "E" => (1, 1, 18),
        "Ki" => (1 << 10, 1, 0),
        "Mi" => (1 << 20, 1, 0),
        "Gi" => (1 << 30, 1, 0),
        "Ti" => (1 << 40, 1, 0),
        "Pi" => (1 << 50, 1, 0),
        "Ei" => (1 << 60, 1, 0),
        e if e.starts_with(['e', 'E']) => (1, 1, e[1..].parse().ok()?),
        _ => return None,
    };
    let (neg, digits) = match num.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if (int.is_empty() && frac.is_empty()) || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let mantissa: i128 = format!("{int}{frac}").parse().ok()?;
    // value = mantissa * 10^(exp10 - frac.len()) * mult, in nano-units: * 10^9.
    let exp = exp10 - frac.len() as i32 + 9;
    let mut v = mantissa.checked_mul(mult_num)? / mult_den;
    if exp >= 0 {
        v = v.checked_mul(10i128.checked_pow(exp as u32)?)?;
    } else {
        // Below a nano-unit: Kubernetes rounds up.
        let d = 10i128.checked_pow((-exp) as u32)?;
        v = (v + d - 1) / d;
    }
    Some(if neg { -v } else { v })
}

/// What a device offers to an expression.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    /// `device.driver`.
    pub driver: &'a str,
    /// Attributes by fully qualified name (`domain/name`).
    pub attributes: &'a BTreeMap<String, AttrValue>,
    /// Capacity in nano-units by fully qualified name.
    pub capacity: &'a BTreeMap<String, i128>,
}

/// A runtime value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Bool(bool),
    Int(i64),
    Str(String),
    Version(Semver),
    /// Nano-units.
    Quantity(i128),
    List(Vec<Value>),
    /// A domain's attributes or capacities (`device.attributes["gpu.nvidia.com"]`).
    Domain {
        capacity: bool,
        domain: String,
    },
    /// `device` itself, and the maps `device.attributes`, `device.capacity`.
    Device,
    DeviceMap {
        capacity: bool,
    },
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Str(_) => "string",
            Value::Version(_) => "semver",
            Value::Quantity(_) => "quantity",
            Value::List(_) => "list",
            Value::Domain { .. } | Value::DeviceMap { .. } => "map",
            Value::Device => "device",
        }
    }
}

impl From<&AttrValue> for Value {
    fn from(a: &AttrValue) -> Self {
        match a {
            AttrValue::Int(i) => Value::Int(*i),
            AttrValue::Bool(b) => Value::Bool(*b),
            AttrValue::Str(s) => Value::Str(s.clone()),
            AttrValue::Version(v) => Value::Version(v.clone()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// A parsed expression.
#[derive(Debug, Clone)]
enum Expr {
    Lit(Value),
    Device,
    Select(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    /// `has(e.f)`.
    Has(Box<Expr>, String),
    Call {
        target: Option<Box<Expr>>,
        name: String,
        args: Vec<Expr>,
        regex: Option<regex::Regex>,
    },
    Not(Box<Expr>),
    Neg(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
    Bin(BinOp, Box<Expr>, Box<Expr>),
    List(Vec<Expr>),
}

/// A compiled selector expression.
#[derive(Debug, Clone)]
pub struct Program {
    source: String,
    expr: Expr,
}

impl PartialEq for Program {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}
impl Eq for Program {}
impl std::hash::Hash for Program {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.source.hash(state)
    }
}

impl serde::Serialize for Program {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

impl<'de> serde::Deserialize<'de> for Program {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Program::compile(&s).map_err(serde::de::Error::custom)
    }
}

/// Why an expression does not compile or evaluate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CelError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, CelError> {
    Err(CelError(msg.into()))
}

impl Program {
    /// Parses an expression; anything outside the supported subset is an error saying what.
    pub fn compile(source: &str) -> Result<Program, CelError> {
        use crate::limits::MAX_CEL_EXPRESSION_BYTES;
        if source.len() > MAX_CEL_EXPRESSION_BYTES {
            return err(format!(
                "expression of {} bytes; at most {MAX_CEL_EXPRESSION_BYTES} are allowed (the API server's limit)",
                source.len()
            ));
        }
        let tokens = lex(source)?;
        let mut p = Parser { tokens, pos: 0, depth: 0 };
        let expr = p.expr()?;
        if p.pos != p.tokens.len() {
            return err(format!("unexpected {} at end of expression", p.tokens[p.pos]));
        }
        Ok(Program { source: source.to_string(), expr })
    }

    /// The expression's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the device matches: the expression must give a `bool`.
    pub fn matches(&self, device: &DeviceView<'_>) -> Result<bool, CelError> {
        match eval(&self.expr, device)? {
            Value::Bool(b) => Ok(b),
            v => err(format!("expression gives a {}, not a bool", v.type_name())),
        }
    }
}

// ---- lexer ----

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Int(i64),
    Str(String),
    Ident(String),
    Punct(&'static str),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Int(i) => write!(f, "`{i}`"),
            Tok::Str(s) => write!(f, "{s:?}"),
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Punct(p) => write!(f, "`{p}`"),
        }
    }
}

const PUNCT: [&str; 23] = [
    "&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "(", ")", "[", "]", ".", ",", "?", ":", "+", "-", "*",
    "/", "%", "{",
];

fn lex(src: &str) -> Result<Vec<Tok>, CelError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i < b.len() && (b[i] == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit) || b[i] == b'e') {
                return err("floating-point numbers are not supported in device selectors");
            }
            if i < b.len() && (b[i] == b'u' || b[i] == b'U') {
                i += 1;
            }
            let digits = src[start..i].trim_end_matches(['u', 'U']);
            out.push(Tok::Int(
                digits.parse().map_err(|_| CelError(format!("integer {digits} out of range")))?,
            ));
        } else if c == b'_' || c.is_ascii_alphabetic() {
            let start = i;
            while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                i += 1;
            }
            out.push(Tok::Ident(src[start..i].to_string()));
        } else if c == b'"' || c == b'\'' {
            let raw =
                out.last() == Some(&Tok::Ident("r".into())) || out.last() == Some(&Tok::Ident("R".into()));
            if raw {
                out.pop();
            }
            let triple = b[i..].starts_with(&[c, c, c]);
            let q = if triple { 3 } else { 1 };
            i += q;
            let mut s = String::new();
            loop {
                if i >= b.len() {
                    return err("unterminated string");
                }
                if b[i..].starts_with(&vec![c; q]) {
                    i += q;
                    break;
                }
                let ch = src[i..].chars().next().unwrap_or_default();
                if ch == '\\' && !raw {
                    let e =
                        src[i + 1..].chars().next().ok_or_else(|| CelError("unterminated string".into()))?;
                    s.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        '\\' | '"' | '\'' | '`' | '?' => e,
                        _ => return err(format!("unsupported escape \\{e}")),
                    });
                    i += 1 + e.len_utf8();
                } else {
                    s.push(ch);
                    i += ch.len_utf8();
                }
            }
            out.push(Tok::Str(s));
        } else {
            match PUNCT.iter().find(|p| src[i..].starts_with(**p)) {
                Some(p) => {
                    out.push(Tok::Punct(p));
                    i += p.len();
                }
                None => {
                    return err(format!("unexpected character {:?}", src[i..].chars().next().unwrap_or('?')))
                }
            }
        }
    }
    Ok(out)
}

// ---- parser (CEL's grammar: ?: < || < && < relations < + - < * / % < unary < member) ----

struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
    /// How deep the expression tree is at this point: recursion and chained operators both
    /// count, so neither parsing, evaluating nor dropping the tree can overflow the stack.
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos)
    }
    fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Punct(q)) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, p: &str) -> Result<(), CelError> {
        if self.eat(p) {
            Ok(())
        } else {
            match self.peek() {
                Some(t) => err(format!("expected `{p}`, found {t}")),
                None => err(format!("expected `{p}` at end of expression")),
            }
        }
    }
    /// One more level of nesting, refused past [`crate::limits::MAX_CEL_NESTING`].
    fn deeper(&mut self) -> Result<(), CelError> {
        self.depth += 1;
        if self.depth > crate::limits::MAX_CEL_NESTING {
            return err(format!(
                "expression nested deeper than {} levels (the API server's CEL parser limit)",
                crate::limits::MAX_CEL_NESTING
            ));
        }
        Ok(())
    }
    fn expr(&mut self) -> Result<Expr, CelError> {
        self.deeper()?;
        let e = self.conditional();
        self.depth -= 1;
        e
    }
    fn conditional(&mut self) -> Result<Expr, CelError> {
        let c = self.or()?;
        if self.eat("?") {
            let a = self.or()?;
            self.expect(":")?;
            let b = self.expr()?;
            return Ok(Expr::Cond(Box::new(c), Box::new(a), Box::new(b)));
        }
        Ok(c)
    }
    fn or(&mut self) -> Result<Expr, CelError> {
        let start = self.depth;
        let mut l = self.and()?;
        while self.eat("||") {
            self.deeper()?;
            l = Expr::Or(Box::new(l), Box::new(self.and()?));
        }
        self.depth = start;
        Ok(l)
    }
    fn and(&mut self) -> Result<Expr, CelError> {
        let start = self.depth;
        let mut l = self.relation()?;
        while self.eat("&&") {
            self.deeper()?;
            l = Expr::And(Box::new(l), Box::new(self.relation()?));
        }
        self.depth = start;
        Ok(l)
    }
    fn relation(&mut self) -> Result<Expr, CelError> {
        let start = self.depth;
        let mut l = self.addition()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Punct("==")) => BinOp::Eq,
                Some(Tok::Punct("!=")) => BinOp::Ne,
                Some(Tok::Punct("<")) => BinOp::Lt,
                Some(Tok::Punct("<=")) => BinOp::Le,
                Some(Tok::Punct(">")) => BinOp::Gt,
                Some(Tok::Punct(">=")) => BinOp::Ge,
                Some(Tok::Ident(s)) if s == "in" => BinOp::In,
                _ => {
                    self.depth = start;
                    return Ok(l);
                }
            };
            self.pos += 1;
            self.deeper()?;
            l = Expr::Bin(op, Box::new(l), Box::new(self.addition()?));
        }
    }
    fn addition(&mut self) -> Result<Expr, CelError> {
        let start = self.depth;
        let mut l = self.multiplication()?;
        loop {
            let op = if self.eat("+") {
                BinOp::Add
            } else if self.eat("-") {
                BinOp::Sub
            } else {
                self.depth = start;
                return Ok(l);
            };
            self.deeper()?;
            l = Expr::Bin(op, Box::new(l), Box::new(self.multiplication()?));
        }
    }
    fn multiplication(&mut self) -> Result<Expr, CelError> {
        let start = self.depth;
        let mut l = self.unary()?;
        loop {
            let op = if self.eat("*") {
                BinOp::Mul
            } else if self.eat("/") {
                BinOp::Div
            } else if self.eat("%") {
                BinOp::Rem
            } else {
                self.depth = start;
                return Ok(l);
            };
            self.deeper()?;
            l = Expr::Bin(op, Box::new(l), Box::new(self.unary()?));
        }
    }
    fn unary(&mut self) -> Result<Expr, CelError> {
        self.deeper()?;
        let e = if self.eat("!") {
            self.unary().map(|e| Expr::Not(Box::new(e)))
        } else if self.eat("-") {
            self.unary().map(|e| Expr::Neg(Box::new(e)))
        } else {
            self.member()
        };
        self.depth -= 1;
        e
    }
    fn args(&mut self) -> Result<Vec<Expr>, CelError> {
        let mut args = Vec::new();
        if self.eat(")") {
            return Ok(args);
        }
        loop {
            args.push(self.expr()?);
            if self.eat(")") {
                return Ok(args);
            }
            self.expect(",")?;
        }
    }
    fn call(target: Option<Expr>, name: String, args: Vec<Expr>) -> Result<Expr, CelError> {
        const METHODS: [&str; 16] = [
            "matches",
            "startsWith",
            "endsWith",
            "contains",
            "lowerAscii",
            "upperAscii",
            "size",
            "compareTo",
            "isGreaterThan",
            "isLessThan",
            "asInteger",
            "major",
            "minor",
            "patch",
            "isQuantity",
            "isSemver",
        ];
        const GLOBALS: [&str; 7] = ["quantity", "semver", "isQuantity", "isSemver", "size", "int", "string"];
        match &target {
            Some(_) if !METHODS.contains(&name.as_str()) => {
                return err(format!("function `.{name}()` is not supported in device selectors"))
            }
            None if !GLOBALS.contains(&name.as_str()) => {
                return err(format!("function `{name}()` is not supported in device selectors"))
            }
            _ => {}
        }
        // A literal pattern compiles once, here, and its errors are compile errors.
        let regex = match (name.as_str(), args.first()) {
            ("matches", Some(Expr::Lit(Value::Str(p)))) => Some(
                regex::Regex::new(p)
                    .map_err(|e| CelError(format!("invalid regular expression {p:?}: {e}")))?,
            ),
            _ => None,
        };
        Ok(Expr::Call { target: target.map(Box::new), name, args, regex })
    }
    fn member(&mut self) -> Result<Expr, CelError> {
        let start = self.depth;
        let mut e = self.primary()?;
        loop {
            if !matches!(self.peek(), Some(Tok::Punct("." | "["))) {
                self.depth = start;
                return Ok(e);
            }
            self.deeper()?;
            if self.eat(".") {
                let Some(Tok::Ident(name)) = self.peek().cloned() else {
                    return err("expected a field or method name after `.`");
                };
                self.pos += 1;
                if self.eat("(") {
                    let args = self.args()?;
                    e = Self::call(Some(e), name, args)?;
                } else {
                    e = Expr::Select(Box::new(e), name);
                }
            } else if self.eat("[") {
                let i = self.expr()?;
                self.expect("]")?;
                e = Expr::Index(Box::new(e), Box::new(i));
            } else {
                return Ok(e);
            }
        }
    }
    fn primary(&mut self) -> Result<Expr, CelError> {
        let Some(t) = self.peek().cloned() else {
            return err("unexpected end of expression");
        };
        self.pos += 1;
        match t {
            Tok::Int(i) => Ok(Expr::Lit(Value::Int(i))),
            Tok::Str(s) => Ok(Expr::Lit(Value::Str(s))),
            Tok::Punct("(") => {
                let e = self.expr()?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Punct("[") => {
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.expr()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                Ok(Expr::List(items))
            }
            Tok::Ident(name) => match name.as_str() {
                "true" => Ok(Expr::Lit(Value::Bool(true))),
                "false" => Ok(Expr::Lit(Value::Bool(false))),
                "has" if self.eat("(") => {
                    let inner = self.expr()?;
                    self.expect(")")?;
                    match inner {
                        Expr::Select(target, field) => Ok(Expr::Has(target, field)),
                        _ => err("has() takes a field selection, as in has(device.attributes[\"d\"].name)"),
                    }
                }
                _ if self.eat("(") => {
                    let args = self.args()?;
                    Self::call(None, name, args)
                }
                "device" => Ok(Expr::Device),
                _ => err(format!("undeclared reference `{name}` (device selectors see only `device`)")),
            },
            Tok::Punct(p) => err(format!("unexpected `{p}`")),
        }
    }
}

// ---- evaluation ----

fn domain_get<'a>(capacity: bool, domain: &str, key: &str, d: &DeviceView<'a>) -> Option<Value> {
    let full = format!("{domain}/{key}");
    if capacity {
        d.capacity.get(&full).map(|q| Value::Quantity(*q))
    } else {
        d.attributes.get(&full).map(Value::from)
    }
}

fn select(target: Value, field: &str, d: &DeviceView<'_>) -> Result<Option<Value>, CelError> {
    Ok(match target {
        Value::Device => match field {
            "driver" => Some(Value::Str(d.driver.to_string())),
            "attributes" => Some(Value::DeviceMap { capacity: false }),
            "capacity" => Some(Value::DeviceMap { capacity: true }),
            _ => None,
        },
        Value::Domain { capacity, domain } => domain_get(capacity, &domain, field, d),
        // `device.attributes.foo` selects a domain without dots.
        Value::DeviceMap { capacity } => Some(Value::Domain { capacity, domain: field.to_string() }),
        v => return err(format!("cannot select field `{field}` of a {}", v.type_name())),
    })
}

fn eval(e: &Expr, d: &DeviceView<'_>) -> Result<Value, CelError> {
    match e {
        Expr::Lit(v) => Ok(v.clone()),
        Expr::Device => Ok(Value::Device),
        Expr::Select(t, f) => {
            let target = eval(t, d)?;
            select(target, f, d)?.ok_or_else(|| CelError(format!("no such key: {f}")))
        }
        Expr::Has(t, f) => Ok(Value::Bool(select(eval(t, d)?, f, d)?.is_some())),
        Expr::Index(t, i) => {
            let target = eval(t, d)?;
            let index = eval(i, d)?;
            match (target, index) {
                (Value::DeviceMap { capacity }, Value::Str(domain)) => Ok(Value::Domain { capacity, domain }),
                (Value::Domain { capacity, domain }, Value::Str(key)) => {
                    domain_get(capacity, &domain, &key, d)
                        .ok_or_else(|| CelError(format!("no such key: {key}")))
                }
                (Value::List(items), Value::Int(i)) => usize::try_from(i)
                    .ok()
                    .and_then(|i| items.get(i).cloned())
                    .ok_or_else(|| CelError(format!("index out of range: {i}"))),
                (t, i) => err(format!("cannot index a {} with a {}", t.type_name(), i.type_name())),
            }
        }
        Expr::Not(x) => match eval(x, d)? {
            Value::Bool(b) => Ok(Value::Bool(!b)),
            v => err(format!("no such overload: !{}", v.type_name())),
        },
        Expr::Neg(x) => match eval(x, d)? {
            Value::Int(i) => {
                i.checked_neg().map(Value::Int).ok_or_else(|| CelError("integer overflow".into()))
            }
            v => err(format!("no such overload: -{}", v.type_name())),
        },
        // CEL's logic is commutative: an error on one side is absorbed when the other decides.
        Expr::And(a, b) => logic(eval(a, d), || eval(b, d), false),
        Expr::Or(a, b) => logic(eval(a, d), || eval(b, d), true),
        Expr::Cond(c, a, b) => match eval(c, d)? {
            Value::Bool(true) => eval(a, d),
            Value::Bool(false) => eval(b, d),
            v => err(format!("condition is a {}, not a bool", v.type_name())),
        },
        Expr::List(items) => Ok(Value::List(items.iter().map(|i| eval(i, d)).collect::<Result<_, _>>()?)),
        Expr::Bin(op, a, b) => binary(*op, eval(a, d)?, eval(b, d)?, d),
        Expr::Call { target, name, args, regex } => {
            let target = target.as_ref().map(|t| eval(t, d)).transpose()?;
            let args: Vec<Value> = args.iter().map(|a| eval(a, d)).collect::<Result<_, _>>()?;
            call(target, name, &args, regex.as_ref())
        }
    }
}

fn logic(
    a: Result<Value, CelError>,
    b: impl FnOnce() -> Result<Value, CelError>,
    decisive: bool,
) -> Result<Value, CelError> {
    let as_bool = |v: Result<Value, CelError>| match v {
        Ok(Value::Bool(b)) => Ok(b),
        Ok(v) => err(format!("no such overload: logical operator on a {}", v.type_name())),
        Err(e) => Err(e),
    };
    let a = as_bool(a);
    if a == Ok(decisive) {
        return Ok(Value::Bool(decisive));
    }
    let b = as_bool(b());
    match (a, b) {
        (_, Ok(v)) if v == decisive => Ok(Value::Bool(decisive)),
        (Ok(_), Ok(_)) => Ok(Value::Bool(!decisive)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

fn binary(op: BinOp, a: Value, b: Value, _d: &DeviceView<'_>) -> Result<Value, CelError> {
    use std::cmp::Ordering;
    let no_overload = |a: &Value, b: &Value| {
        err::<Value>(format!("no such overload: {} {op:?} {}", a.type_name(), b.type_name()))
    };
    let ord = |a: &Value, b: &Value| -> Option<Ordering> {
        match (a, b) {
            (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
            (Value::Str(x), Value::Str(y)) => Some(x.cmp(y)),
            (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
            _ => None,
        }
    };
    match op {
        BinOp::Eq | BinOp::Ne => {
            let same = match (&a, &b) {
                (Value::Int(_), Value::Int(_))
                | (Value::Str(_), Value::Str(_))
                | (Value::Bool(_), Value::Bool(_))
                | (Value::Version(_), Value::Version(_))
                | (Value::Quantity(_), Value::Quantity(_))
                | (Value::List(_), Value::List(_)) => a == b,
                _ => return no_overload(&a, &b),
            };
            Ok(Value::Bool(same == (op == BinOp::Eq)))
        }
        BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            let Some(o) = ord(&a, &b) else {
                return no_overload(&a, &b);
            };
            Ok(Value::Bool(match op {
                BinOp::Lt => o == Ordering::Less,
                BinOp::Le => o != Ordering::Greater,
                BinOp::Gt => o == Ordering::Greater,
                _ => o != Ordering::Less,
            }))
        }
        BinOp::In => match (&a, &b) {
            (_, Value::List(items)) => Ok(Value::Bool(items.contains(&a))),
            (Value::Str(key), Value::Domain { capacity, domain }) => {
                Ok(Value::Bool(domain_get(*capacity, domain, key, _d).is_some()))
            }
            _ => no_overload(&a, &b),
        },
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem => match (&a, &b) {
            (Value::Int(x), Value::Int(y)) => {
                let r = match op {
                    BinOp::Add => x.checked_add(*y),
                    BinOp::Sub => x.checked_sub(*y),
                    BinOp::Mul => x.checked_mul(*y),
                    BinOp::Div if *y == 0 => return err("division by zero"),
                    BinOp::Div => x.checked_div(*y),
                    BinOp::Rem if *y == 0 => return err("modulus by zero"),
                    _ => x.checked_rem(*y),
                };
                r.map(Value::Int).ok_or_else(|| CelError("integer overflow".into()))
            }
            (Value::Str(x), Value::Str(y)) if op == BinOp::Add => Ok(Value::Str(format!("{x}{y}"))),
            _ => no_overload(&a, &b),
        },
    }
}

fn call(
    target: Option<Value>,
    name: &str,
    args: &[Value],
    regex: Option<&regex::Regex>,
) -> Result<Value, CelError> {
    use std::cmp::Ordering;
    let cmp_int = |o: Ordering| Value::Int(o as i64);
    let bad = || {
        err::<Value>(format!(
            "no such overload: {}{name}({})",
            target.as_ref().map(|t| format!("{}.", t.type_name())).unwrap_or_default(),
            args.iter().map(Value::type_name).collect::<Vec<_>>().join(", ")
        ))
    };
    match (target.as_ref(), name, args) {
        (None, "quantity", [Value::Str(s)]) => parse_quantity_nanos(s)
            .map(Value::Quantity)
            .ok_or_else(|| CelError(format!("invalid quantity {s:?}"))),
        (None, "isQuantity", [Value::Str(s)]) => Ok(Value::Bool(parse_quantity_nanos(s).is_some())),
        (None, "semver", [Value::Str(s)]) => {
            Semver::parse(s).map(Value::Version).ok_or_else(|| CelError(format!("invalid semver {s:?}")))
        }
        (None, "isSemver", [Value::Str(s)]) => Ok(Value::Bool(Semver::parse(s).is_some())),
        (None, "int", [Value::Int(i)]) => Ok(Value::Int(*i)),
        (None, "string", [v]) => Ok(Value::Str(match v {
            Value::Str(s) => s.clone(),
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Version(v) => v.to_string(),
            _ => return bad(),
        })),
        (None, "size", [Value::Str(s)]) | (Some(Value::Str(s)), "size", []) => {
            Ok(Value::Int(s.chars().count() as i64))
        }
        (None, "size", [Value::List(l)]) | (Some(Value::List(l)), "size", []) => {
            Ok(Value::Int(l.len() as i64))
        }
        (Some(Value::Str(s)), "matches", [Value::Str(p)]) => match regex {
            Some(r) => Ok(Value::Bool(r.is_match(s))),
            None => regex::Regex::new(p)
                .map(|r| Value::Bool(r.is_match(s)))
                .map_err(|e| CelError(format!("invalid regular expression {p:?}: {e}"))),
        },
        (Some(Value::Str(s)), "startsWith", [Value::Str(p)]) => Ok(Value::Bool(s.starts_with(p.as_str()))),
        (Some(Value::Str(s)), "endsWith", [Value::Str(p)]) => Ok(Value::Bool(s.ends_with(p.as_str()))),
        (Some(Value::Str(s)), "contains", [Value::Str(p)]) => Ok(Value::Bool(s.contains(p.as_str()))),
        (Some(Value::Str(s)), "lowerAscii", []) => Ok(Value::Str(s.to_ascii_lowercase())),
        (Some(Value::Str(s)), "upperAscii", []) => Ok(Value::Str(s.to_ascii_uppercase())),
        (Some(Value::Quantity(a)), "compareTo", [Value::Quantity(b)]) => Ok(cmp_int(a.cmp(b))),
        (Some(Value::Quantity(a)), "isGreaterThan", [Value::Quantity(b)]) => Ok(Value::Bool(a > b)),
        (Some(Value::Quantity(a)), "isLessThan", [Value::Quantity(b)]) => Ok(Value::Bool(a < b)),
        (Some(Value::Quantity(a)), "asInteger", []) => {
            if a % 1_000_000_000 != 0 {
                return err("quantity is not an integer");
            }
            i64::try_from(a / 1_000_000_000).map(Value::Int).map_err(|_| CelError("integer overflow".into()))
        }
        (Some(Value::Version(a)), "compareTo", [Value::Version(b)]) => Ok(cmp_int(a.cmp(b))),
        (Some(Value::Version(a)), "isGreaterThan", [Value::Version(b)]) => Ok(Value::Bool(a > b)),
        (Some(Value::Version(a)), "isLessThan", [Value::Version(b)]) => Ok(Value::Bool(a < b)),
        (Some(Value::Version(v)), "major", []) => Ok(Value::Int(v.core.0 as i64)),
        (Some(Value::Version(v)), "minor", []) => Ok(Value::Int(v.core.1 as i64)),
        (Some(Value::Version(v)), "patch", []) => Ok(Value::Int(v.core.2 as i64)),
        _ => bad(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> (BTreeMap<String, AttrValue>, BTreeMap<String, i128>) {
        let d = "gpu.nvidia.com";
        let attrs = BTreeMap::from([
            (format!("{d}/type"), AttrValue::Str("gpu".into())),
            (format!("{d}/productName"), AttrValue::Str("NVIDIA H100 80GB HBM3".into())),
            (format!("{d}/architecture"), AttrValue::Str("Hopper".into())),
            (format!("{d}/index"), AttrValue::Int(3)),
            (format!("{d}/driverVersion"), AttrValue::Version(Semver::parse("550.90.7").unwrap())),
            (format!("{d}/cudaComputeCapability"), AttrValue::Version(Semver::parse("9.0.0").unwrap())),
            (format!("{d}/mig"), AttrValue::Bool(false)),
        ]);
        let cap = BTreeMap::from([(format!("{d}/memory"), parse_quantity_nanos("81559Mi").unwrap())]);
        (attrs, cap)
    }

    fn run(expr: &str) -> Result<bool, CelError> {
        let (a, c) = gpu();
        Program::compile(expr)?.matches(&DeviceView {
            driver: "gpu.nvidia.com",
            attributes: &a,
            capacity: &c,
        })
    }

    #[test]
    fn selectors_of_real_device_classes_and_claims() {
        // NVIDIA's DeviceClass gpu.nvidia.com.
        assert_eq!(
            run("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"),
            Ok(true)
        );
        assert_eq!(run("device.driver == 'mig.nvidia.com'"), Ok(false));
        assert_eq!(run(r#"device.attributes["gpu.nvidia.com"].productName.matches("H100")"#), Ok(true));
        assert_eq!(
            run(r#"device.attributes["gpu.nvidia.com"].productName.matches("^NVIDIA A100")"#),
            Ok(false)
        );
        assert_eq!(
            run(r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0"#),
            Ok(true)
        );
        assert_eq!(
            run(r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0"#),
            Ok(false)
        );
        assert_eq!(
            run(r#"device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("79Gi"))"#),
            Ok(true)
        );
        assert_eq!(
            run(r#"device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))"#),
            Ok(true)
        );
        assert_eq!(
            run(
                r#"device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0"#
            ),
            Ok(true)
        );
        assert_eq!(run(r#"device.attributes["gpu.nvidia.com"].index in [0, 1, 2, 3]"#), Ok(true));
        assert_eq!(
            run(r#"device.attributes["gpu.nvidia.com"].architecture in ["Ampere", "Ada Lovelace"]"#),
            Ok(false)
        );
        assert_eq!(run(r#"!device.attributes["gpu.nvidia.com"].mig"#), Ok(true));
        assert_eq!(run(r#""productName" in device.attributes["gpu.nvidia.com"]"#), Ok(true));
        assert_eq!(run(r#"has(device.attributes["gpu.nvidia.com"].uuid)"#), Ok(false));
        assert_eq!(run(r#"device.attributes["gpu.nvidia.com"].index > 2 || false"#), Ok(true));
        assert_eq!(run("device.attributes['gpu.nvidia.com'].index % 2 == 1 ? true : false"), Ok(true));
    }

    #[test]
    fn missing_attributes_are_errors_unless_the_other_side_decides() {
        // As Kubernetes: "no such key" at run time, absorbed by a deciding `&&`/`||` side.
        let e = run(r#"device.attributes["gpu.nvidia.com"].uuid == "x""#).unwrap_err();
        assert!(e.0.contains("no such key: uuid"), "{e}");
        assert_eq!(
            run(r#"device.driver == "other" && device.attributes["gpu.nvidia.com"].uuid == "x""#),
            Ok(false)
        );
        assert_eq!(
            run(r#"device.attributes["gpu.nvidia.com"].uuid == "x" && device.driver == "other""#),
            Ok(false)
        );
        assert_eq!(
            run(r#"device.attributes["gpu.nvidia.com"].uuid == "x" || device.driver == "gpu.nvidia.com""#),
            Ok(true)
        );
        assert!(run(r#"device.attributes["gpu.nvidia.com"].uuid == "x" || device.driver == "x""#).is_err());
        // Unknown domains are empty maps.
        assert!(run(r#"device.attributes["dra.example.com"].size() == 0"#).is_err());
        assert_eq!(run(r#""x" in device.attributes["dra.example.com"]"#), Ok(false));
    }

    #[test]
    fn type_errors_and_unsupported_syntax_are_errors_never_matches() {
        assert!(run(r#"device.attributes["gpu.nvidia.com"].index == "3""#)
            .unwrap_err()
            .0
            .contains("no such overload"));
        assert!(run(r#"device.attributes["gpu.nvidia.com"].productName"#)
            .unwrap_err()
            .0
            .contains("not a bool"));
        assert!(Program::compile("device.attributes.exists(a, a == 1)").is_err());
        assert!(Program::compile("request.name == 'x'").unwrap_err().0.contains("undeclared reference"));
        assert!(Program::compile("device.driver == ").is_err());
        assert!(Program::compile("device.driver.matches('(')")
            .unwrap_err()
            .0
            .contains("invalid regular expression"));
        assert!(Program::compile("1.5 > 1").is_err());
        assert!(run("quantity('12x') == quantity('1')").is_err());
    }

    #[test]
    fn quantities_and_versions_parse_as_kubernetes_does() {
        assert_eq!(parse_quantity_nanos("1"), Some(1_000_000_000));
        assert_eq!(parse_quantity_nanos("500m"), Some(500_000_000));
        assert_eq!(parse_quantity_nanos("1.5Gi"), Some(3 * (1i128 << 29) * 1_000_000_000));
        assert_eq!(parse_quantity_nanos("80G"), Some(80_000_000_000 * 1_000_000_000));
        assert_eq!(parse_quantity_nanos("2e3"), Some(2000 * 1_000_000_000));
        assert_eq!(parse_quantity_nanos("Gi"), None);
        assert_eq!(parse_quantity_nanos("1Zi"), None);
        assert!(Semver::parse("1.2.3-rc.1").unwrap() < Semver::parse("1.2.3").unwrap());
        assert!(Semver::parse("1.10.0").unwrap() > Semver::parse("1.9.9").unwrap());
        assert_eq!(Semver::parse("1.2"), None);
        assert_eq!(Semver::parse("01.2.3"), None);
    }

    #[test]
    fn nesting_and_length_are_bounded_as_the_api_server_bounds_them() {
        use crate::limits::{MAX_CEL_EXPRESSION_BYTES, MAX_CEL_NESTING};
        // Within the bound, deep nesting of each kind compiles and evaluates.
        let ok = 100;
        for e in [
            format!("{}true{}", "(".repeat(ok), ")".repeat(ok)),
            format!("{}true", "!!".repeat(ok / 2)),
            vec!["true"; ok].join(" || "),
            vec!["true"; ok].join(" && "),
            format!("{}1 == 1", "1 + ".repeat(ok)),
            format!("{}1]{} == [1]", "[".repeat(ok), "]".repeat(ok - 1)),
        ] {
            assert!(run(&e).is_ok(), "{e}: {:?}", run(&e));
        }
        // Past it, each is an error naming the limit, not a stack overflow: 3,000 parentheses
        // (the issue's selector) and 10,000, and chains of each binary operator (whose trees
        // are as deep as they are long).
        let deep = [
            format!("{}true{}", "(".repeat(3000), ")".repeat(3000)),
            format!("{}true", "(".repeat(10_000)),
            format!("{}true", "!".repeat(MAX_CEL_NESTING + 1)),
            vec!["true"; MAX_CEL_NESTING + 2].join("||"),
            vec!["true"; MAX_CEL_NESTING + 2].join("&&"),
            format!("{}1 == 1", "1+".repeat(MAX_CEL_NESTING + 1)),
            format!("{}1 == 1", "1*".repeat(MAX_CEL_NESTING + 1)),
            format!("{}true", "1==".repeat(MAX_CEL_NESTING + 1)),
            format!("device{}", ".x".repeat(MAX_CEL_NESTING + 1)),
            format!("{}1", "[".repeat(MAX_CEL_NESTING + 1)),
        ];
        for e in deep {
            let why = Program::compile(&e).unwrap_err().0;
            let ok = why.contains(&format!("nested deeper than {MAX_CEL_NESTING}"))
                || why.contains(&format!("at most {MAX_CEL_EXPRESSION_BYTES}"));
            assert!(ok, "{}: {why}", &e[..40.min(e.len())]);
        }
        let long = format!("device.driver == \"{}\"", "x".repeat(MAX_CEL_EXPRESSION_BYTES));
        let why = Program::compile(&long).unwrap_err().0;
        assert!(why.contains(&format!("{} bytes", long.len())), "{why}");
    }
}
