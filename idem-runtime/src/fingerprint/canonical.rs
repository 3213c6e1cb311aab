//! The canonical form of a JSON document that fingerprints hash (see [`super::Fingerprint`]):
//! compact, object members sorted by name, `null` members left out, strings re-escaped one way,
//! numbers as written.
//!
//! A small parser of its own rather than `serde_json::Value`, which cannot hold integers beyond
//! 64 bits without a crate-wide feature and would round them into floats.

use sha2::{Digest, Sha256};

/// How deeply documents may nest, as serde_json's own limit.
const MAX_DEPTH: usize = 128;

/// Feeds the canonical form of `json` to `out`; an error says why `json` is not a JSON document.
pub(super) fn write(json: &[u8], out: &mut Sha256) -> Result<(), String> {
    let mut parser = Parser {
        text: json,
        at: 0,
        depth: 0,
    };
    let mut canonical = Vec::with_capacity(json.len());
    parser.skip_space();
    parser.value(&mut canonical)?;
    parser.skip_space();
    if parser.at != json.len() {
        return Err(format!("trailing characters at byte {}", parser.at));
    }
    out.update(&canonical);
    Ok(())
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        self.skip_space();
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected `{}` at byte {}", byte as char, self.at))
        }
    }

    /// Writes one value's canonical form; returns whether it was `null`.
    fn value(&mut self, out: &mut Vec<u8>) -> Result<bool, String> {
        match self.peek() {
            Some(b'{') => self.nested(|parser| parser.object(out)).map(|()| false),
            Some(b'[') => self.nested(|parser| parser.array(out)).map(|()| false),
            Some(b'"') => {
                let text = self.string()?;
                write_string(&text, out);
                Ok(false)
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.at;
                while matches!(
                    self.peek(),
                    Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                ) {
                    self.at += 1;
                }
                out.extend_from_slice(&self.text[start..self.at]);
                Ok(false)
            }
            _ => {
                for literal in [&b"true"[..], b"false", b"null"] {
                    if self.text[self.at..].starts_with(literal) {
                        self.at += literal.len();
                        out.extend_from_slice(literal);
                        return Ok(literal == b"null");
                    }
                }
                Err(format!("expected a value at byte {}", self.at))
            }
        }
    }

    fn nested(
        &mut self,
        parse: impl FnOnce(&mut Self) -> Result<(), String>,
    ) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("nested too deeply".to_owned());
        }
        let result = parse(self);
        self.depth -= 1;
        result
    }

    fn object(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        self.at += 1; // `{`
        let mut members: Vec<(String, Vec<u8>)> = Vec::new();
        self.skip_space();
        if self.peek() == Some(b'}') {
            self.at += 1;
        } else {
            loop {
                self.skip_space();
                if self.peek() != Some(b'"') {
                    return Err(format!("expected a member name at byte {}", self.at));
                }
                let name = self.string()?;
                self.expect(b':')?;
                self.skip_space();
                let mut value = Vec::new();
                if !self.value(&mut value)? {
                    members.push((name, value));
                }
                self.skip_space();
                match self.peek() {
                    Some(b',') => self.at += 1,
                    Some(b'}') => {
                        self.at += 1;
                        break;
                    }
                    _ => return Err(format!("expected `,` or `}}` at byte {}", self.at)),
                }
            }
        }
        members.sort_by(|a, b| a.0.cmp(&b.0));
        out.push(b'{');
        for (i, (name, value)) in members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(name, out);
            out.push(b':');
            out.extend_from_slice(value);
        }
        out.push(b'}');
        Ok(())
    }

    fn array(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        self.at += 1; // `[`
        out.push(b'[');
        self.skip_space();
        if self.peek() == Some(b']') {
            self.at += 1;
        } else {
            let mut first = true;
            loop {
                if !first {
                    out.push(b',');
                }
                first = false;
                self.skip_space();
                self.value(out)?;
                self.skip_space();
                match self.peek() {
                    Some(b',') => self.at += 1,
                    Some(b']') => {
                        self.at += 1;
                        break;
                    }
                    _ => return Err(format!("expected `,` or `]` at byte {}", self.at)),
                }
            }
        }
        out.push(b']');
        Ok(())
    }

    /// Reads a string, its escapes decoded.
    fn string(&mut self) -> Result<String, String> {
        self.at += 1; // `"`
        let mut bytes = Vec::new();
        loop {
            let Some(byte) = self.peek() else {
                return Err("unterminated string".to_owned());
            };
            self.at += 1;
            match byte {
                b'"' => break,
                b'\\' => {
                    let escape = self.peek().ok_or("unterminated string")?;
                    self.at += 1;
                    let decoded = match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        other => return Err(format!("invalid escape `\\{}`", other as char)),
                    };
                    bytes.extend_from_slice(decoded.encode_utf8(&mut [0; 4]).as_bytes());
                }
                0x00..=0x1f => return Err(format!("control character at byte {}", self.at - 1)),
                _ => bytes.push(byte),
            }
        }
        String::from_utf8(bytes).map_err(|_| "a string is not UTF-8".to_owned())
    }

    /// Reads the `XXXX` of a `\uXXXX` escape, and the low half of a surrogate pair.
    fn unicode_escape(&mut self) -> Result<char, String> {
        let high = self.hex4()?;
        if !(0xD800..0xDC00).contains(&high) {
            return char::from_u32(high).ok_or_else(|| "a lone surrogate".to_owned());
        }
        if !self.text[self.at..].starts_with(b"\\u") {
            return Err("a lone surrogate".to_owned());
        }
        self.at += 2;
        let low = self.hex4()?;
        if !(0xDC00..0xE000).contains(&low) {
            return Err("a lone surrogate".to_owned());
        }
        char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
            .ok_or_else(|| "an invalid surrogate pair".to_owned())
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .text
            .get(self.at..self.at + 4)
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| u32::from_str_radix(digits, 16).ok())
            .ok_or_else(|| format!("invalid \\u escape at byte {}", self.at))?;
        self.at += 4;
        Ok(digits)
    }
}

/// A string as serde_json writes it: one escape for each character that needs one.
fn write_string(text: &str, out: &mut Vec<u8>) {
    // Serializing a `str` into a vector cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}
