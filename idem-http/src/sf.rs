//! Structured-field items (RFC 8941, section 4.2): the one shape `Idempotency-Key` takes, a
//! string with parameters, the parameters checked and set aside.

/// Why a header is not a structured-field string item.
pub(crate) type Malformed = &'static str;

/// The string of the item `raw` holds (`"k"`, `"k";v=1`), its parameters checked and ignored;
/// surrounding spaces and tabs allowed.
pub(crate) fn string_item(raw: &[u8]) -> Result<String, Malformed> {
    let mut input = Cursor {
        rest: raw.trim_ascii(),
    };
    let string = input.string()?;
    input.parameters()?;
    if input.rest.is_empty() {
        Ok(string)
    } else {
        Err("something follows the quoted string and its parameters")
    }
}

/// What is left of the field to parse.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.rest.first().copied()
    }

    fn next(&mut self) -> Option<u8> {
        let (&first, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(first)
    }

    /// Consumes bytes while `keep` accepts them; how many.
    fn skip_while(&mut self, keep: impl Fn(u8) -> bool) -> usize {
        let count = self.rest.iter().take_while(|&&byte| keep(byte)).count();
        self.rest = &self.rest[count..];
        count
    }

    /// A string (section 4.2.5): `"`, printable ASCII with `\"` and `\\` escaped, `"`.
    fn string(&mut self) -> Result<String, Malformed> {
        if self.next() != Some(b'"') {
            return Err("it is not a quoted string");
        }
        let mut string = String::new();
        loop {
            match self.next() {
                Some(b'"') => return Ok(string),
                Some(b'\\') => match self.next() {
                    Some(escaped @ (b'"' | b'\\')) => string.push(char::from(escaped)),
                    _ => return Err("a backslash escapes only \" and \\"),
                },
                Some(byte @ 0x20..=0x7e) => string.push(char::from(byte)),
                Some(_) => return Err("it holds a character outside printable ASCII"),
                None => return Err("the quoted string is not closed"),
            }
        }
    }

    /// Parameters (section 4.2.3.2): `;` then optional spaces, a key, and `=` with a value or
    /// none (`true`).
    fn parameters(&mut self) -> Result<(), Malformed> {
        while self.peek() == Some(b';') {
            self.next();
            self.skip_while(|byte| byte == b' ');
            self.key()?;
            if self.peek() == Some(b'=') {
                self.next();
                self.bare_item()?;
            }
        }
        Ok(())
    }

    /// A key (section 4.2.3.3): a lowercase letter or `*`, then lowercase letters, digits, `_`,
    /// `-`, `.` or `*`.
    fn key(&mut self) -> Result<(), Malformed> {
        match self.next() {
            Some(b'a'..=b'z' | b'*') => {}
            _ => return Err("a parameter's name starts with a lowercase letter or *"),
        }
        self.skip_while(
            |byte| matches!(byte, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'),
        );
        Ok(())
    }

    /// A bare item (section 4.2.3.1): a number, string, token, byte sequence or boolean.
    fn bare_item(&mut self) -> Result<(), Malformed> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'"') => self.string().map(drop),
            Some(b'A'..=b'Z' | b'a'..=b'z' | b'*') => {
                self.next();
                self.skip_while(|byte| is_tchar(byte) || byte == b':' || byte == b'/');
                Ok(())
            }
            Some(b':') => self.byte_sequence(),
            Some(b'?') => {
                self.next();
                match self.next() {
                    Some(b'0' | b'1') => Ok(()),
                    _ => Err("a boolean is ?0 or ?1"),
                }
            }
            _ => Err("a parameter's value is not a structured-field item"),
        }
    }

    /// An integer or a decimal (section 4.2.4): at most 15 digits, or 12 and 1 to 3 decimals.
    fn number(&mut self) -> Result<(), Malformed> {
        if self.peek() == Some(b'-') {
            self.next();
        }
        let whole = self.skip_while(|byte| byte.is_ascii_digit());
        if whole == 0 {
            return Err("a number has a digit after its sign");
        }
        if self.peek() != Some(b'.') {
            return if whole <= 15 {
                Ok(())
            } else {
                Err("an integer has at most 15 digits")
            };
        }
        self.next();
        let decimals = self.skip_while(|byte| byte.is_ascii_digit());
        if whole <= 12 && (1..=3).contains(&decimals) {
            Ok(())
        } else {
            Err("a decimal has at most 12 digits and 1 to 3 decimals")
        }
    }

    /// A byte sequence (section 4.2.7): base64 between colons.
    fn byte_sequence(&mut self) -> Result<(), Malformed> {
        self.next();
        self.skip_while(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'/' | b'='));
        match self.next() {
            Some(b':') => Ok(()),
            _ => Err("a byte sequence is base64 between colons"),
        }
    }
}

/// A token's character (RFC 9110, section 5.6.2).
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

#[cfg(test)]
mod tests {
    use super::string_item;

    #[test]
    fn a_string_with_any_parameters_is_its_string() {
        for (raw, string) in [
            (r#""k""#, "k"),
            (" \t\"k\" ", "k"),
            (r#""a\"b""#, r#"a"b"#),
            (r#""k";v=1"#, "k"),
            (r#""k";a;b=?0;c="x;y";d=-1.5;e=:AQ==:;f=tok/en:1;*g=*"#, "k"),
            (r#""k"; a=1;  b=2"#, "k"),
        ] {
            assert_eq!(string_item(raw.as_bytes()).as_deref(), Ok(string), "{raw}");
        }
    }

    #[test]
    fn anything_else_is_malformed() {
        for raw in [
            r#""k";"#,
            r#""k" ;a=1"#,
            r#""k";A=1"#,
            r#""k";1a=1"#,
            r#""k";a="#,
            r#""k";a=1.2345"#,
            r#""k";a=1234567890123456"#,
            r#""k";a=?2"#,
            r#""k";a=:AQ=="#,
            r#""k";a="open"#,
            r#""k",  "l""#,
            r#""k"x"#,
            "k",
            "\"k",
        ] {
            assert!(string_item(raw.as_bytes()).is_err(), "{raw}");
        }
    }
}
