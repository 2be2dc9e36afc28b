//! Reading the text of an input file (a snapshot, a provider config) without trusting it: in
//! bounded chunks up to a size limit, refusing binary data and nesting deeper than a limit as
//! soon as they show (so `/dev/zero` or a stream of `[` costs one chunk, not the machine), and
//! decoding what editors and shells write: UTF-8 with or without a byte-order mark, and UTF-16
//! with one (PowerShell's `>`).

use std::io::Read;
use thiserror::Error;

/// Bounds on one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimits {
    /// Largest input in bytes.
    pub max_bytes: u64,
    /// Deepest nesting of `[`/`{` (JSON and YAML flow collections).
    pub max_depth: usize,
}

/// The default size limit: 1 GiB, six times a 5,000-node cluster's `kubectl get -o json`.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 1 << 30;
/// The default nesting limit: the recursion limit of the JSON parser; Kubernetes objects,
/// `managedFields` included, nest about twenty deep.
pub const DEFAULT_MAX_DEPTH: usize = crate::limits::MAX_DOCUMENT_NESTING;

impl Default for InputLimits {
    fn default() -> Self {
        Self { max_bytes: DEFAULT_MAX_INPUT_BYTES, max_depth: DEFAULT_MAX_DEPTH }
    }
}

/// Why an input's text could not be read.
#[derive(Debug, Error)]
pub enum TextError {
    /// Reading failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Larger than the limit.
    #[error("larger than the input limit of {limit} bytes (raise it with --max-input-mib)")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// Not text: NUL bytes, invalid UTF-8, or UTF-16 that does not decode.
    #[error("not a text file: {reason}")]
    Binary {
        /// What was found.
        reason: String,
    },
    /// Nesting deeper than the limit.
    #[error("line {line}: nesting deeper than {limit} levels")]
    TooDeep {
        /// 1-based line where the limit was passed.
        line: usize,
        /// The limit.
        limit: usize,
    },
}

const CHUNK: usize = 64 * 1024;

/// Reads all of `reader` as text within `limits`.
pub fn read_text(reader: impl Read, limits: InputLimits) -> Result<String, TextError> {
    read_text_sized(reader, limits, 0)
}

/// [`read_text`] of an input about `size_hint` bytes long (a file's length): the buffer is
/// allocated once instead of growing through copies.
pub fn read_text_sized(
    mut reader: impl Read,
    limits: InputLimits,
    size_hint: u64,
) -> Result<String, TextError> {
    let mut bytes: Vec<u8> = Vec::with_capacity(size_hint.min(limits.max_bytes) as usize + 1);
    let mut utf16 = None;
    let mut checked = 0usize;
    let mut depth = DepthScanner::default();
    loop {
        // Straight into the buffer (no zeroing, no copy), a chunk at a time.
        let before = bytes.len();
        (&mut reader).take(CHUNK as u64).read_to_end(&mut bytes)?;
        if bytes.len() == before {
            break;
        }
        if bytes.len() as u64 > limits.max_bytes {
            return Err(TextError::TooLarge { limit: limits.max_bytes });
        }
        if utf16.is_none() && bytes.len() >= 2 {
            utf16 = Some(match bytes[..2] {
                [0xFF, 0xFE] => Some(Utf16::Little),
                [0xFE, 0xFF] => Some(Utf16::Big),
                _ => None,
            });
        }
        if let Some(None) = utf16 {
            // UTF-8: check what arrived (up to a character split by the chunk boundary).
            let valid = match std::str::from_utf8(&bytes[checked..]) {
                Ok(_) => bytes.len(),
                Err(e) if e.error_len().is_none() => checked + e.valid_up_to(),
                Err(e) => {
                    let at = checked + e.valid_up_to();
                    return Err(TextError::Binary { reason: format!("invalid UTF-8 at byte {at}") });
                }
            };
            let text = &bytes[checked..valid];
            if let Some(i) = memchr_nul(text) {
                return Err(TextError::Binary { reason: format!("NUL byte at byte {}", checked + i) });
            }
            depth.feed(text, limits.max_depth).map_err(|at| too_deep(&bytes, checked + at, limits))?;
            checked = valid;
        }
    }
    match utf16.flatten() {
        Some(order) => {
            let text = decode_utf16(&bytes[2..], order)?;
            if let Some(i) = text.find('\0') {
                return Err(TextError::Binary { reason: format!("NUL character at character {i}") });
            }
            DepthScanner::default()
                .feed(text.as_bytes(), limits.max_depth)
                .map_err(|at| too_deep(text.as_bytes(), at, limits))?;
            Ok(text)
        }
        None => {
            if checked != bytes.len() {
                return Err(TextError::Binary { reason: "truncated UTF-8 at the end".into() });
            }
            let mut text = String::from_utf8(bytes).expect("validated chunk by chunk");
            if text.starts_with('\u{feff}') {
                text.drain(..'\u{feff}'.len_utf8());
            }
            Ok(text)
        }
    }
}

fn memchr_nul(bytes: &[u8]) -> Option<usize> {
    memchr::memchr(0, bytes)
}

#[derive(Debug, Clone, Copy)]
enum Utf16 {
    Little,
    Big,
}

fn decode_utf16(bytes: &[u8], order: Utf16) -> Result<String, TextError> {
    if !bytes.len().is_multiple_of(2) {
        return Err(TextError::Binary { reason: "UTF-16 with an odd number of bytes".into() });
    }
    let units = bytes.chunks_exact(2).map(|p| match order {
        Utf16::Little => u16::from_le_bytes([p[0], p[1]]),
        Utf16::Big => u16::from_be_bytes([p[0], p[1]]),
    });
    char::decode_utf16(units)
        .collect::<Result<String, _>>()
        .map_err(|e| TextError::Binary { reason: format!("invalid UTF-16: {e}") })
}

/// The nesting error for the bracket at `offset` of `text`, with its line.
fn too_deep(text: &[u8], offset: usize, limits: InputLimits) -> TextError {
    let line = 1 + memchr::memchr_iter(b'\n', &text[..offset]).count();
    TextError::TooDeep { line, limit: limits.max_depth }
}

/// Tracks the nesting of `[` and `{` outside quoted strings and comments, over chunks. It is a
/// guard, not a parser: brackets inside YAML plain scalars count too, which only matters for
/// inputs with over a hundred of them unclosed.
#[derive(Debug, Default)]
struct DepthScanner {
    depth: usize,
    started: bool,
    quote: Option<u8>,
    escaped: bool,
    comment: bool,
    /// The previous byte ends a token (start of input, whitespace, `:`, `,`, `[`, `{`), so a
    /// quote here opens a string; inside a YAML plain scalar (`it's`) it does not.
    boundary: bool,
}

impl DepthScanner {
    /// Scans the next bytes; `Err(offset)` of the bracket that passes `limit`.
    fn feed(&mut self, bytes: &[u8], limit: usize) -> Result<(), usize> {
        if !self.started {
            self.started = true;
            self.boundary = true;
        }
        let mut i = 0;
        while i < bytes.len() {
            if let Some(q) = self.quote {
                if self.escaped {
                    self.escaped = false;
                    i += 1;
                    continue;
                }
                // Quoted strings are most of a snapshot: skip to the closing quote or escape.
                let rest = &bytes[i..];
                let stop = if q == b'"' { memchr::memchr2(q, b'\\', rest) } else { memchr::memchr(q, rest) };
                let run = stop.unwrap_or(rest.len());
                i += run;
                if stop.is_some() {
                    if bytes[i] == b'\\' {
                        self.escaped = true;
                    } else {
                        self.quote = None;
                    }
                    i += 1;
                }
                continue;
            }
            if self.comment {
                match memchr::memchr(b'\n', &bytes[i..]) {
                    Some(j) => i += j,
                    None => return Ok(()),
                }
            }
            // Between strings: jump to the next byte that matters (the byte before it says
            // whether a quote or `#` there starts a string or comment).
            let skip =
                bytes[i..].iter().position(|&b| SIGNIFICANT[usize::from(b)]).unwrap_or(bytes.len() - i);
            if skip > 0 {
                i += skip;
                self.boundary = is_boundary(bytes[i - 1]);
                if i == bytes.len() {
                    break;
                }
            }
            let b = bytes[i];
            i += 1;
            if b == b'\n' {
                self.comment = false;
            }
            match b {
                b'"' | b'\'' if self.boundary => self.quote = Some(b),
                b'#' if self.boundary => self.comment = true,
                b'[' | b'{' => {
                    self.depth += 1;
                    if self.depth > limit {
                        return Err(i - 1);
                    }
                }
                b']' | b'}' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
            self.boundary = is_boundary(b);
        }
        Ok(())
    }
}

/// Whether a quote or `#` after this byte starts a string or a comment.
fn is_boundary(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b':' | b',' | b'[' | b'{' | b'-')
}

/// The bytes [`DepthScanner`] acts on outside strings and comments.
const SIGNIFICANT: [bool; 256] = {
    let mut t = [false; 256];
    let mut k = 0;
    let bytes = *b"\"'#[]{}\n";
    while k < bytes.len() {
        t[bytes[k] as usize] = true;
        k += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8]) -> Result<String, TextError> {
        read_text(bytes, InputLimits::default())
    }

    #[test]
    fn byte_order_marks_and_utf16_decode() {
        assert_eq!(read(b"\xEF\xBB\xBFkind: Node\n").unwrap(), "kind: Node\n");
        let le: Vec<u8> =
            [0xFF, 0xFE].into_iter().chain("kind: Nöde".encode_utf16().flat_map(u16::to_le_bytes)).collect();
        assert_eq!(read(&le).unwrap(), "kind: Nöde");
        let be: Vec<u8> =
            [0xFE, 0xFF].into_iter().chain("{}".encode_utf16().flat_map(u16::to_be_bytes)).collect();
        assert_eq!(read(&be).unwrap(), "{}");
    }

    #[test]
    fn binary_input_stops_at_the_first_chunk() {
        // An endless stream of zeros, as /dev/zero gives.
        let zeros = std::io::repeat(0).take(u64::MAX);
        assert!(matches!(read_text(zeros, InputLimits::default()), Err(TextError::Binary { .. })));
        assert!(matches!(read(b"kind: \xFF\xFE\xFD"), Err(TextError::Binary { .. })));
        // A multi-byte character split by a chunk boundary is fine.
        let mut text = "a".repeat(CHUNK - 1).into_bytes();
        text.extend("é and more".as_bytes());
        assert!(read(&text).is_ok());
    }

    #[test]
    fn size_and_depth_limits() {
        let small = InputLimits { max_bytes: 10, ..Default::default() };
        assert!(matches!(read_text(&b"0123456789ab"[..], small), Err(TextError::TooLarge { limit: 10 })));
        assert!(read_text(&b"0123456789"[..], small).is_ok());
        // An endless stream of `[` stops at the limit.
        let brackets = std::io::repeat(b'[').take(u64::MAX);
        assert!(matches!(
            read_text(brackets, InputLimits::default()),
            Err(TextError::TooDeep { line: 1, .. })
        ));
        // The line is the bracket's, counting lines inside quoted strings and comments.
        let late = format!("a: 'x\ny'\n# c\nb: \"\\\n\"\n{}", "[".repeat(200));
        assert!(
            matches!(read(late.as_bytes()), Err(TextError::TooDeep { line: 6, limit: 128 })),
            "{:?}",
            read(late.as_bytes())
        );
        let deep = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert!(read(deep.as_bytes()).is_ok());
        // Brackets in strings and comments do not count; a quote inside a word opens nothing.
        let quoted = format!(
            "a: \"{}\"\nb: '{}'\n# {}\nc: it's {{}}\n",
            "[".repeat(500),
            "{".repeat(500),
            "[".repeat(500)
        );
        assert!(read(quoted.as_bytes()).is_ok(), "{:?}", read(quoted.as_bytes()));
        let escaped = format!("{{\"a\": \"\\\"{}\"}}", "[".repeat(500));
        assert!(read(escaped.as_bytes()).is_ok());
    }
}
