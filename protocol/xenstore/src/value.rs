//! The value format of crane's keys: space-separated `key=value` fields, keys
//! in `[a-z0-9-]`, values percent-encoded outside `[A-Za-z0-9-._~:/@+,]`. One
//! line of printable ASCII, as xenstore.txt recommends, readable with
//! `xenstore-read`, and strict to parse: unknown or duplicate keys, bad
//! escapes, over-long values and non-printable bytes are errors that say what
//! is wrong.

use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("the value is {len} bytes long, more than the {max} allowed")]
    TooLong { len: usize, max: usize },
    #[error("the value is empty")]
    Empty,
    #[error("byte {offset} of the value is not printable ASCII")]
    NotPrintable { offset: usize },
    #[error("field {index} is empty (doubled or stray space)")]
    EmptyField { index: usize },
    #[error("field {index} has no '='")]
    NoEquals { index: usize },
    #[error("field {index} has an invalid key (want [a-z0-9-], 1 to 32 characters)")]
    BadKey { index: usize },
    #[error("key {0} appears twice")]
    DuplicateKey(String),
    #[error("the value of {key} has an invalid character or escape at offset {offset}")]
    BadEncoding { key: String, offset: usize },
    #[error("unknown key {0}")]
    UnknownKey(String),
    #[error("key {0} is missing")]
    Missing(String),
    #[error("{key}={value:?} is not valid: {why}")]
    BadValue {
        key: String,
        value: String,
        why: &'static str,
    },
}

fn is_raw(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~:/@+,".contains(&b)
}

fn valid_key(k: &str) -> bool {
    (1..=32).contains(&k.len())
        && k.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Percent-encodes a value.
pub fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if is_raw(b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn decode(key: &str, v: &str) -> Result<String, ValueError> {
    let bad = |offset| ValueError::BadEncoding {
        key: key.to_string(),
        offset,
    };
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).ok_or(bad(i))?;
            let hex = std::str::from_utf8(hex).map_err(|_| bad(i))?;
            if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad(i));
            }
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad(i))?);
            i += 3;
        } else if is_raw(b[i]) {
            out.push(b[i]);
            i += 1;
        } else {
            return Err(bad(i));
        }
    }
    String::from_utf8(out).map_err(|_| bad(0))
}

/// The fields of one value, in order. Parsing consumes them with
/// [`Fields::take`] and friends; [`Fields::finish`] rejects what is left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    pairs: Vec<(String, String)>,
}

impl Fields {
    pub fn new() -> Fields {
        Fields::default()
    }

    /// Adds a field (the key must be a valid key; values are encoded when
    /// formatting).
    pub fn push(&mut self, key: &str, value: impl Into<String>) -> &mut Self {
        debug_assert!(valid_key(key), "invalid key {key}");
        self.pairs.push((key.to_string(), value.into()));
        self
    }

    pub fn format(&self) -> String {
        self.pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn parse(s: &str, max_len: usize) -> Result<Fields, ValueError> {
        if s.len() > max_len {
            return Err(ValueError::TooLong {
                len: s.len(),
                max: max_len,
            });
        }
        if let Some(offset) = s.bytes().position(|b| !(0x20..0x7f).contains(&b)) {
            return Err(ValueError::NotPrintable { offset });
        }
        if s.is_empty() {
            return Err(ValueError::Empty);
        }
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (index, field) in s.split(' ').enumerate() {
            if field.is_empty() {
                return Err(ValueError::EmptyField { index });
            }
            let (k, v) = field
                .split_once('=')
                .ok_or(ValueError::NoEquals { index })?;
            if !valid_key(k) {
                return Err(ValueError::BadKey { index });
            }
            if pairs.iter().any(|(have, _)| have == k) {
                return Err(ValueError::DuplicateKey(k.to_string()));
            }
            let v = decode(k, v)?;
            pairs.push((k.to_string(), v));
        }
        Ok(Fields { pairs })
    }

    /// Removes and returns a field.
    pub fn take(&mut self, key: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(k, _)| k == key)?;
        Some(self.pairs.remove(i).1)
    }

    pub fn required(&mut self, key: &str) -> Result<String, ValueError> {
        self.take(key)
            .ok_or_else(|| ValueError::Missing(key.to_string()))
    }

    /// An optional decimal integer without sign or leading zeros.
    pub fn u64(&mut self, key: &str) -> Result<Option<u64>, ValueError> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        parse_u64(key, &v).map(Some)
    }

    pub fn required_u64(&mut self, key: &str) -> Result<u64, ValueError> {
        self.u64(key)?
            .ok_or_else(|| ValueError::Missing(key.to_string()))
    }

    /// Fails on the first field nobody took.
    pub fn finish(self) -> Result<(), ValueError> {
        match self.pairs.into_iter().next() {
            Some((k, _)) => Err(ValueError::UnknownKey(k)),
            None => Ok(()),
        }
    }
}

pub(crate) fn bad_value(key: &str, value: &str, why: &'static str) -> ValueError {
    ValueError::BadValue {
        key: key.to_string(),
        value: value.chars().take(64).collect(),
        why,
    }
}

pub(crate) fn parse_u64(key: &str, v: &str) -> Result<u64, ValueError> {
    let digits_ok = !v.is_empty()
        && v.len() <= 20
        && v.bytes().all(|b| b.is_ascii_digit())
        && (v == "0" || !v.starts_with('0'));
    if !digits_ok {
        return Err(bad_value(key, v, "not a decimal number"));
    }
    v.parse()
        .map_err(|_| bad_value(key, v, "number out of range"))
}

/// Milliseconds as `123.456` (three decimals at most).
pub(crate) fn format_ms(ms: f64) -> String {
    let ms = if ms.is_finite() && ms >= 0.0 { ms } else { 0.0 };
    let s = format!("{ms:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() { "0".into() } else { s.into() }
}

pub(crate) fn parse_ms(key: &str, v: &str) -> Result<f64, ValueError> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    let ok = !int.is_empty()
        && int.len() <= 12
        && frac.len() <= 3
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
        && (v.contains('.') != frac.is_empty());
    if !ok {
        return Err(bad_value(key, v, "not a duration in milliseconds"));
    }
    v.parse()
        .map_err(|_| bad_value(key, v, "not a duration in milliseconds"))
}

/// Cuts an error text to [`crate::layout::MAX_ERROR_CHARS`] characters.
pub fn clip_error(s: &str) -> String {
    let max = crate::layout::MAX_ERROR_CHARS;
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(max - 3).collect();
        out.push_str("...");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_with_escapes() {
        let mut f = Fields::new();
        f.push("seq", "7")
            .push("error", "app 12 said: 100% \"bad\"=x\n")
            .push("proxy", "tcp://10.0.0.2:7000");
        let s = f.format();
        assert!(s.bytes().all(|b| (0x20..0x7f).contains(&b)));
        assert_eq!(
            s,
            "seq=7 error=app%2012%20said:%20100%25%20%22bad%22%3Dx%0A proxy=tcp://10.0.0.2:7000"
        );
        let mut back = Fields::parse(&s, 1024).unwrap();
        assert_eq!(back.required_u64("seq").unwrap(), 7);
        assert_eq!(
            back.required("error").unwrap(),
            "app 12 said: 100% \"bad\"=x\n"
        );
        assert_eq!(back.required("proxy").unwrap(), "tcp://10.0.0.2:7000");
        back.finish().unwrap();
    }

    #[test]
    fn hostile_values_give_errors() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("seq=1  op=x", "empty"),
            ("seq=1 op", "no '='"),
            ("SEQ=1", "invalid key"),
            ("seq=1 seq=2", "twice"),
            ("seq=%zz", "invalid character"),
            ("seq=%4", "invalid character"),
            ("seq=a b=\u{1}", "printable"),
            ("seq=\"x\"", "invalid character"),
            ("e=%FF%FE", "invalid character"),
            ("é=1", "printable"),
        ];
        for (input, want) in cases {
            let e = Fields::parse(input, 1024).unwrap_err().to_string();
            assert!(e.contains(want), "{input:?}: {e}");
        }
        let long = format!("k={}", "a".repeat(2000));
        assert!(matches!(
            Fields::parse(&long, 1024),
            Err(ValueError::TooLong { .. })
        ));
        let mut f = Fields::parse("seq=01 x=1", 100).unwrap();
        assert!(f.u64("seq").is_err());
        let f = Fields::parse("x=1", 100).unwrap();
        assert_eq!(f.finish(), Err(ValueError::UnknownKey("x".into())));
        let mut f = Fields::parse("n=99999999999999999999", 100).unwrap();
        assert!(f.u64("n").unwrap_err().to_string().contains("out of range"));
    }

    #[test]
    fn milliseconds() {
        assert_eq!(format_ms(12.5), "12.5");
        assert_eq!(format_ms(3.0), "3");
        assert_eq!(format_ms(f64::NAN), "0");
        assert_eq!(parse_ms("ms", "12.125").unwrap(), 12.125);
        for bad in ["", "1.", ".5", "1.2345", "-1", "1e3", "inf", "NaN"] {
            assert!(parse_ms("ms", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn errors_are_clipped() {
        let e = clip_error(&"x".repeat(1000));
        assert_eq!(e.chars().count(), crate::layout::MAX_ERROR_CHARS);
    }
}
