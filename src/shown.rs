//! The one way text from outside (object names, reasons, cloud and file error messages) is shown
//! on any stream: the plan table on stdout, log lines and errors on stderr, Events and status
//! ConfigMaps. Every control character (line breaks, ESC and other terminal escapes, DEL, C1
//! codes) and every bidirectional override is written as Rust writes it in a quoted string (`\n`,
//! `\t`, `\r`, `\0`, else `\u{1b}`), so a name can neither forge a line nor drive a terminal,
//! and a character reads the same whether a message shows a value as it is or quotes it (`{:?}`).
//! (JSON and YAML output keep the exact value: their own string escaping is safe.)

use std::borrow::Cow;
use std::fmt::{self, Write};

/// Whether `c` is written escaped.
fn escaped(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character and bidirectional override escaped as Rust's `{:?}`
/// escapes it (`"a\nb"` → `a\nb`, ESC → `\u{1b}`); borrowed when there is none.
pub fn shown(text: &str) -> Cow<'_, str> {
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let _ = Escaping(&mut out).write_str(text);
    Cow::Owned(out)
}

/// A value whose `Display` is [`shown`]: `tracing::warn!(node = %Shown(&name), …)`,
/// `format!("{}", Shown(err))`.
#[derive(Debug, Clone, Copy)]
pub struct Shown<T>(pub T);

impl<T: fmt::Display> fmt::Display for Shown<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(Escaping(f), "{}", self.0)
    }
}

/// A writer that escapes what passes through it, as [`shown`] does.
pub struct Escaping<W>(pub W);

impl<W: Write> Write for Escaping<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(at) = rest.find(escaped) {
            self.0.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            match c {
                '\n' | '\r' | '\t' | '\0' => write!(self.0, "{}", c.escape_debug())?,
                _ => write!(self.0, "{}", c.escape_unicode())?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_overrides_are_escaped_one_way() {
        assert_eq!(shown("ml/web-0"), Cow::Borrowed("ml/web-0"));
        assert_eq!(shown("a\nb"), r"a\nb");
        assert_eq!(shown("\u{1b}[2J\r\t\0\u{7f}\u{9b}\u{85}"), r"\u{1b}[2J\r\t\0\u{7f}\u{9b}\u{85}");
        // As `{:?}` writes the same characters inside quotes.
        let odd = "a\nb\u{1b}c\td\u{7f}";
        assert_eq!(format!("{odd:?}"), format!("\"{}\"", shown(odd)));
        assert_eq!(shown("x\u{202e}y\u{2066}"), r"x\u{202e}y\u{2066}");
        assert_eq!(shown("GPU ü → 日本"), "GPU ü → 日本");
        assert_eq!(Shown("p\nq").to_string(), shown("p\nq"));
        assert_eq!(format!("{}", Shown(format_args!("{}-{}", "a\u{1b}", 1))), r"a\u{1b}-1");
        // Escaping twice changes nothing: escaped text has no control characters left.
        assert_eq!(shown(&shown("a\nb")), shown("a\nb"));
    }
}
