//! YAML snapshots transcoded to JSON text, one parser event at a time.
//!
//! serde_yaml reads all the events of a document into memory before it deserializes any (tens of
//! bytes per scalar), and a value tree is built after that: one YAML object of a million labels
//! cost thirty times its size before a bound could refuse it. Here a pull parser's events are
//! written straight out as each document's JSON text, which then takes the JSON paths (the List
//! fast path, and the bounds of [`crate::limits`] on each object's text before it is parsed), so
//! a YAML snapshot costs about twice its size, as a JSON one costs once.
//!
//! Plain scalars resolve as serde_yaml resolves them (YAML 1.2's core schema: `null`, `true`,
//! integers in decimal, hex, octal and binary, floats; a leading zero keeps `0123` a string),
//! merge keys (`<<: *defaults`, YAML 1.1, which kubectl accepts) apply with explicit keys first,
//! then earlier sources before later ones, and aliases expand within a budget proportional to the
//! file (a "billion laughs" is refused). Duplicate keys are written as they come; the JSON reader
//! keeps the last, as kubectl does.

use super::SnapshotError;
use crate::limits::{MAX_ALIAS_EXPANSION_SLACK, MAX_DOCUMENT_NESTING};
use std::collections::HashMap;
use std::path::Path;
use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// The JSON text of each document of the YAML `text` read from `path`, in order (an empty
/// document is `null`).
pub(super) fn to_json_docs(path: &Path, text: &str) -> Result<Vec<String>, SnapshotError> {
    let mut writer = Writer {
        out: Vec::with_capacity(text.len().min(64 << 20)),
        frames: Vec::new(),
        anchors: HashMap::new(),
        spent: 0,
        budget: 2 * text.len() + MAX_ALIAS_EXPANSION_SLACK,
    };
    let mut docs = Vec::new();
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser
            .next_token()
            .map_err(|e| Error { mark: *e.marker(), message: e.info().to_string() }.at(path))?;
        match event {
            Event::StreamEnd => break,
            Event::Nothing | Event::StreamStart => {}
            Event::DocumentStart => writer.start_document(),
            Event::DocumentEnd => docs.push(writer.end_document()),
            event => writer.event(event, mark).map_err(|e| e.at(path))?,
        }
    }
    Ok(docs)
}

/// A transcoding error at a place in the YAML text.
struct Error {
    mark: Marker,
    message: String,
}

impl Error {
    fn new(mark: Marker, message: impl Into<String>) -> Self {
        Self { mark, message: message.into() }
    }

    fn at(self, path: &Path) -> SnapshotError {
        SnapshotError::Yaml {
            path: path.to_path_buf(),
            line: self.mark.line(),
            column: self.mark.col() + 1,
            message: self.message,
        }
    }
}

/// An open mapping or sequence, and where its text starts in the output.
struct Frame {
    start: usize,
    /// Its anchor id (0: none), to keep its text for aliases when it ends.
    anchor: usize,
    /// No entry written yet (no comma before the next).
    empty: bool,
    kind: FrameKind,
}

enum FrameKind {
    Sequence,
    Mapping {
        next: Next,
        /// The entries of merge sources (`<<`), as JSON members text, in source order.
        merged: Vec<String>,
    },
}

/// What a mapping reads next.
#[derive(Clone, Copy)]
enum Next {
    Key,
    Value,
    /// The value of a merge key, written from this offset, to be cut out when it ends.
    MergeValue(usize),
}

struct Writer {
    out: Vec<u8>,
    frames: Vec<Frame>,
    /// Each anchor's JSON text.
    anchors: HashMap<usize, String>,
    /// Bytes written or kept for anchors so far, over all documents.
    spent: usize,
    /// The most `spent` may reach: twice the file (escapes lengthen strings a little) and a
    /// slack; only aliases can pass it.
    budget: usize,
}

impl Writer {
    fn start_document(&mut self) {
        self.out.clear();
        self.frames.clear();
        self.anchors.clear();
    }

    fn end_document(&mut self) -> String {
        self.spent += self.out.len();
        if self.out.is_empty() {
            return "null".into();
        }
        // Everything written is JSON text made of UTF-8 strings and ASCII. (Copied out at its
        // size: the buffer, sized for the file, is reused.)
        let doc = String::from_utf8(self.out.to_vec()).unwrap_or_default();
        self.out.clear();
        doc
    }

    fn event(&mut self, event: Event, mark: Marker) -> Result<(), Error> {
        let key_next = matches!(
            self.frames.last(),
            Some(Frame { kind: FrameKind::Mapping { next: Next::Key, .. }, .. })
        );
        match event {
            Event::Scalar(value, style, anchor, tag) if key_next => {
                let merge = style == TScalarStyle::Plain && value == "<<" && tag.is_none();
                let start = self.out.len();
                if merge {
                    self.set_next(Next::MergeValue(start));
                } else {
                    self.key(&value);
                    self.set_next(Next::Value);
                }
                if anchor != 0 {
                    self.keep(anchor, string_json(&value), mark)?;
                }
            }
            Event::Alias(id) if key_next => {
                let text = self.anchors.get(&id).ok_or_else(|| Error::new(mark, "an alias to no anchor"))?;
                let key = match serde_json::from_str::<serde_json::Value>(text) {
                    Ok(serde_json::Value::String(s)) => s,
                    Ok(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => v.to_string(),
                    Ok(serde_json::Value::Null) => "null".into(),
                    _ => {
                        return Err(Error::new(mark, "a mapping key must be a string, not a mapping or list"))
                    }
                };
                self.key(&key);
                self.set_next(Next::Value);
            }
            Event::MappingStart(..) | Event::SequenceStart(..) if key_next => {
                return Err(Error::new(mark, "a mapping key must be a string, not a mapping or list"));
            }
            Event::Scalar(value, style, anchor, tag) => {
                self.begin_value();
                let start = self.out.len();
                write_scalar(&mut self.out, &value, style, tag.as_ref());
                if anchor != 0 {
                    let text = String::from_utf8_lossy(&self.out[start..]).into_owned();
                    self.keep(anchor, text, mark)?;
                }
                self.end_value(mark)?;
            }
            Event::Alias(id) => {
                let len =
                    self.anchors.get(&id).ok_or_else(|| Error::new(mark, "an alias to no anchor"))?.len();
                self.spent += len;
                if self.spent + self.out.len() > self.budget {
                    return Err(self.over_budget(mark));
                }
                self.begin_value();
                let text = &self.anchors[&id];
                self.out.extend_from_slice(text.as_bytes());
                self.end_value(mark)?;
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.frames.len() >= MAX_DOCUMENT_NESTING {
                    return Err(Error::new(
                        mark,
                        format!("nesting deeper than {MAX_DOCUMENT_NESTING} mappings and lists"),
                    ));
                }
                self.begin_value();
                let start = self.out.len();
                let kind = if matches!(event, Event::MappingStart(..)) {
                    self.out.push(b'{');
                    FrameKind::Mapping { next: Next::Key, merged: Vec::new() }
                } else {
                    self.out.push(b'[');
                    FrameKind::Sequence
                };
                self.frames.push(Frame { start, anchor, empty: true, kind });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(frame) = self.frames.pop() else { return Ok(()) };
                if let FrameKind::Mapping { merged, .. } = frame.kind {
                    if !merged.is_empty() {
                        // Later sources first, then earlier ones, then the explicit keys: the
                        // JSON reader keeps the last of duplicate keys.
                        let mut members: Vec<&str> = merged.iter().rev().map(String::as_str).collect();
                        members.retain(|m| !m.is_empty());
                        let mut prefix = members.join(",");
                        if !prefix.is_empty() && !frame.empty {
                            prefix.push(',');
                        }
                        let at = frame.start + 1;
                        self.out.splice(at..at, prefix.into_bytes());
                    }
                    self.out.push(b'}');
                } else {
                    self.out.push(b']');
                }
                if frame.anchor != 0 {
                    let text = String::from_utf8_lossy(&self.out[frame.start..]).into_owned();
                    self.keep(frame.anchor, text, mark)?;
                }
                self.end_value(mark)?;
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
        Ok(())
    }

    fn set_next(&mut self, to: Next) {
        if let Some(Frame { kind: FrameKind::Mapping { next, .. }, .. }) = self.frames.last_mut() {
            *next = to;
        }
    }

    /// Writes a mapping's key and its colon.
    fn key(&mut self, key: &str) {
        self.begin_value();
        write_string(&mut self.out, key);
        self.out.push(b':');
    }

    /// The comma before a list item or a mapping entry.
    fn begin_value(&mut self) {
        if let Some(frame) = self.frames.last_mut() {
            let entry_starts = match frame.kind {
                FrameKind::Sequence => true,
                FrameKind::Mapping { next, .. } => matches!(next, Next::Key),
            };
            if entry_starts {
                if !frame.empty {
                    self.out.push(b',');
                }
                frame.empty = false;
            }
        }
    }

    /// After a whole value: a mapping reads a key next; a merge source is cut out to be merged.
    fn end_value(&mut self, mark: Marker) -> Result<(), Error> {
        let Some(Frame { kind: FrameKind::Mapping { next, merged }, .. }) = self.frames.last_mut() else {
            return Ok(());
        };
        if let Next::MergeValue(start) = *next {
            let text = self.out.split_off(start);
            let text = std::str::from_utf8(&text).unwrap_or_default();
            merge_sources(text, merged).ok_or_else(|| {
                Error::new(mark, "the value of a merge key `<<` must be a mapping or a list of mappings")
            })?;
        }
        *next = Next::Key;
        Ok(())
    }

    /// Keeps an anchor's text for its aliases, within the budget.
    fn keep(&mut self, anchor: usize, text: String, mark: Marker) -> Result<(), Error> {
        self.spent += text.len();
        if self.spent + self.out.len() > self.budget {
            return Err(self.over_budget(mark));
        }
        self.anchors.insert(anchor, text);
        Ok(())
    }

    fn over_budget(&self, mark: Marker) -> Error {
        Error::new(
            mark,
            format!(
                "aliases expand past {} bytes, twice the file and {MAX_ALIAS_EXPANSION_SLACK} bytes (a YAML bomb?)",
                self.budget
            ),
        )
    }
}

/// Adds the members of a merge key's value (a mapping, or a list of mappings) to `merged`.
fn merge_sources(text: &str, merged: &mut Vec<String>) -> Option<()> {
    let members = |object: &str| object.strip_prefix('{')?.strip_suffix('}').map(str::to_string);
    if text.starts_with('{') {
        merged.push(members(text)?);
        return Some(());
    }
    let sources: Vec<&serde_json::value::RawValue> = serde_json::from_str(text).ok()?;
    // Earlier sources win over later ones: kept in order, written in reverse.
    for source in sources {
        merged.push(members(source.get())?);
    }
    Some(())
}

/// The YAML 1.2 core schema tag prefix (`!!`).
const CORE: &str = "tag:yaml.org,2002:";

/// Writes a scalar's JSON value: quoted and block scalars and `!!str` are strings; plain ones
/// resolve as serde_yaml resolves them.
fn write_scalar(out: &mut Vec<u8>, value: &str, style: TScalarStyle, tag: Option<&Tag>) {
    let core = tag.filter(|t| t.handle == CORE).map(|t| t.suffix.as_str());
    let resolve = match core {
        Some("str" | "binary" | "timestamp") => false,
        Some("null" | "bool" | "int" | "float") => true,
        _ => style == TScalarStyle::Plain,
    };
    if resolve {
        if value.is_empty() || matches!(value, "~" | "null" | "Null" | "NULL") {
            out.extend_from_slice(b"null");
            return;
        }
        match value {
            "true" | "True" | "TRUE" => return out.extend_from_slice(b"true"),
            "false" | "False" | "FALSE" => return out.extend_from_slice(b"false"),
            _ => {}
        }
        if let Some(int) = parse_int(value) {
            return out.extend_from_slice(int.as_bytes());
        }
        if !digits_but_not_number(value) {
            if let Some(float) = parse_float(value) {
                // Infinities and NaN have no JSON number; serde_json's value of them is null.
                let text = serde_json::Number::from_f64(float).map_or("null".to_string(), |n| n.to_string());
                return out.extend_from_slice(text.as_bytes());
            }
        }
    }
    write_string(out, value);
}

fn write_string(out: &mut Vec<u8>, value: &str) {
    // Writing to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

fn string_json(value: &str) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// An integer in decimal (no leading zero), `0x`, `0o` or `0b`, with one optional sign, as its
/// decimal text (beyond 64 bits JSON readers take it as a float, as serde_yaml's did).
fn parse_int(value: &str) -> Option<String> {
    let (negative, unsigned) = match value.as_bytes().first()? {
        b'-' => (true, &value[1..]),
        b'+' => (false, &value[1..]),
        _ => (false, value),
    };
    let (radix, digits) = if let Some(rest) = unsigned.strip_prefix("0x") {
        (16, rest)
    } else if let Some(rest) = unsigned.strip_prefix("0o") {
        (8, rest)
    } else if let Some(rest) = unsigned.strip_prefix("0b") {
        (2, rest)
    } else {
        if digits_but_not_number(value) {
            return None;
        }
        (10, unsigned)
    };
    if digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = u128::from_str_radix(digits, radix).ok()?;
    match negative {
        false => Some(magnitude.to_string()),
        true if magnitude <= 1 << 127 => Some(format!("-{magnitude}")),
        true => None,
    }
}

/// A float as YAML 1.2 writes it (`.inf`, `.nan` and Rust's decimal syntax, finite only).
fn parse_float(value: &str) -> Option<f64> {
    let unsigned = match value.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => value,
    };
    match unsigned {
        ".inf" | ".Inf" | ".INF" => return Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        _ => {}
    }
    unsigned.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// Leading zeros then digits (`0123`) are a string in YAML 1.2.
fn digits_but_not_number(value: &str) -> bool {
    let unsigned = value.strip_prefix(['-', '+']).unwrap_or(value);
    unsigned.len() > 1 && unsigned.starts_with('0') && unsigned[1..].bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn docs(text: &str) -> Vec<Value> {
        to_json_docs(Path::new("t.yaml"), text)
            .unwrap()
            .iter()
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
            .collect()
    }

    /// What serde_yaml made of the same text, the reference this module replaces.
    fn serde_yaml_docs(text: &str) -> Vec<Value> {
        use serde::Deserialize;
        serde_yaml::Deserializer::from_str(text)
            .map(|doc| {
                let mut yaml = serde_yaml::Value::deserialize(doc).unwrap();
                yaml.apply_merge().unwrap();
                serde_json::to_value(yaml).unwrap()
            })
            .collect()
    }

    #[test]
    fn scalars_resolve_as_serde_yaml_resolves_them() {
        let text = r#"
plain: [~, null, "", true, False, 12, -7, +3, 0x1f, -0x10, 0o17, 0b101, 0123, -0123, 1.5, 1e3, -.5, .inf, -.INF, .nan, 1_000, 12:30, yes, off, 2024-01-02, 18446744073709551615, 1Gi, "100m"]
quoted: ["12", 'true', "~"]
tagged: [!!str 12, !!str true, !!int "12"]
block: |
  line one
  line two
folded: >
  a
  b
empty:
"#;
        assert_eq!(docs(text), serde_yaml_docs(text));
    }

    #[test]
    fn merge_keys_apply_with_explicit_keys_first_then_earlier_sources() {
        let text = "
base: &base {a: 1, b: 1, c: 1}
other: &other {b: 2, d: 2}
one:
  <<: *base
  a: 0
list:
  c: 9
  <<: [*other, *base]
inline:
  <<: {x: 1}
  y: 2
";
        let got = docs(text);
        assert_eq!(got, serde_yaml_docs(text));
        assert_eq!(got[0]["one"], json!({"a": 0, "b": 1, "c": 1}));
        assert_eq!(got[0]["list"], json!({"a": 1, "b": 2, "c": 9, "d": 2}));
    }

    #[test]
    fn documents_and_anchors_are_transcoded_in_order() {
        let text = "---\na: &x [1, {k: v}]\nb: *x\n---\n---\nkind: Pod\n";
        let got = docs(text);
        assert_eq!(
            got,
            vec![json!({"a": [1, {"k": "v"}], "b": [1, {"k": "v"}]}), Value::Null, json!({"kind": "Pod"})]
        );
        assert_eq!(got, serde_yaml_docs(text));
    }

    #[test]
    fn keys_are_strings_and_the_last_duplicate_wins_when_read() {
        let got = docs("1: a\ntrue: b\nk: first\nk: last\n");
        assert_eq!(got[0], json!({"1": "a", "true": "b", "k": "last"}));
        let err = to_json_docs(Path::new("t.yaml"), "? [a]\n: b\n").unwrap_err().to_string();
        assert!(err.contains("t.yaml:") && err.contains("mapping key must be a string"), "{err}");
    }

    #[test]
    fn a_billion_laughs_is_refused_within_its_budget() {
        let mut text =
            String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        let names: Vec<String> = (b'b'..=b'z').map(|c| (c as char).to_string()).collect();
        let mut prev = "a".to_string();
        for n in &names {
            text.push_str(&format!(
                "{n}: &{n} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
            ));
            prev = n.clone();
        }
        let err = to_json_docs(Path::new("bomb.yaml"), &text).unwrap_err().to_string();
        assert!(err.contains("bomb.yaml:") && err.contains("aliases expand past"), "{err}");
        // A few aliases of a small anchor, as real manifests use them, are within it.
        assert_eq!(docs("a: &a {x: 1}\nb: *a\nc: *a\n")[0]["c"], json!({"x": 1}));
    }

    #[test]
    fn nesting_past_the_bound_is_refused_at_its_line() {
        let deep =
            format!("a:\n  b: {}{}\n", "[".repeat(MAX_DOCUMENT_NESTING), "]".repeat(MAX_DOCUMENT_NESTING));
        match to_json_docs(Path::new("deep.yaml"), &deep).unwrap_err() {
            SnapshotError::Yaml { line, message, .. } => {
                assert_eq!(line, 2);
                assert!(message.contains("nesting deeper than 128"), "{message}");
            }
            other => panic!("{other}"),
        }
        let within =
            format!("{}{}", "[".repeat(MAX_DOCUMENT_NESTING - 1), "]".repeat(MAX_DOCUMENT_NESTING - 1));
        assert_eq!(docs(&within).len(), 1);
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        match to_json_docs(Path::new("bad.yaml"), "a: 1\nb: [1, 2\nc: 3\n").unwrap_err() {
            SnapshotError::Yaml { line, column, .. } => assert!(line >= 2 && column > 0, "{line}:{column}"),
            other => panic!("{other}"),
        }
    }
}
