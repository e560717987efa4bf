//! PCI addresses in the form xl and sysfs use: `DDDD:BB:DD.F`.

use std::fmt;
use std::str::FromStr;

/// A PCI device's address (segment, bus, device, function).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddr {
    pub domain: u16,
    pub bus: u8,
    pub dev: u8,
    pub func: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a PCI address (want DDDD:BB:DD.F, e.g. 0000:00:02.0): {why}")]
pub struct PciAddrError {
    text: String,
    why: &'static str,
}

impl PciAddr {
    pub const fn new(domain: u16, bus: u8, dev: u8, func: u8) -> PciAddr {
        PciAddr {
            domain,
            bus,
            dev,
            func,
        }
    }
}

fn hex_field(s: &str, digits: usize, max: u32) -> Option<u32> {
    if s.len() != digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok().filter(|v| *v <= max)
}

impl FromStr for PciAddr {
    type Err = PciAddrError;

    /// `DDDD:BB:DD.F`, or `BB:DD.F` for segment 0, hexadecimal as lspci and
    /// xl print them; device at most 0x1f, function at most 7.
    fn from_str(s: &str) -> Result<PciAddr, PciAddrError> {
        let err = |why| PciAddrError {
            text: s.chars().take(32).collect(),
            why,
        };
        let (slot, func) = s.rsplit_once('.').ok_or(err("no .FUNCTION"))?;
        let parts: Vec<&str> = slot.split(':').collect();
        let (domain, bus, dev) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0000", *b, *v),
            _ => return Err(err("want DOMAIN:BUS:DEVICE before the function")),
        };
        Ok(PciAddr {
            domain: hex_field(domain, 4, 0xffff).ok_or(err("domain is not 4 hex digits"))? as u16,
            bus: hex_field(bus, 2, 0xff).ok_or(err("bus is not 2 hex digits"))? as u8,
            dev: hex_field(dev, 2, 0x1f).ok_or(err("device is not 2 hex digits up to 1f"))? as u8,
            func: hex_field(func, 1, 7).ok_or(err("function is not a digit 0 to 7"))? as u8,
        })
    }
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.dev, self.func
        )
    }
}

impl serde::Serialize for PciAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PciAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PciAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_bdfs() {
        let a: PciAddr = "0000:00:02.0".parse().unwrap();
        assert_eq!(a, PciAddr::new(0, 0, 2, 0));
        assert_eq!(a.to_string(), "0000:00:02.0");
        let b: PciAddr = "00ab:fe:1f.7".parse().unwrap();
        assert_eq!(b, PciAddr::new(0xab, 0xfe, 0x1f, 7));
        assert_eq!(b.to_string(), "00ab:fe:1f.7");
        assert_eq!(
            "05:00.1".parse::<PciAddr>().unwrap(),
            PciAddr::new(0, 5, 0, 1)
        );
        assert_eq!(
            "0000:0A:1B.3".parse::<PciAddr>().unwrap().to_string(),
            "0000:0a:1b.3"
        );
        assert!(PciAddr::new(0, 0, 5, 0) < PciAddr::new(0, 0, 7, 0));
    }

    #[test]
    fn rejects_malformed_bdfs_saying_why() {
        for (bad, why) in [
            ("", "no .FUNCTION"),
            ("0000:00:02", "no .FUNCTION"),
            ("0000:00:02.8", "function"),
            ("0000:00:20.0", "device"),
            ("0000:000:02.0", "bus"),
            ("000:00:02.0", "domain"),
            ("0000:00:02.0.1", "device"),
            ("1:2:3:4.0", "want DOMAIN"),
            ("00:0g.0", "device"),
            ("+000:00:02.0", "domain"),
            ("0000:00:02.-", "function"),
        ] {
            let e = bad.parse::<PciAddr>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn deserializes_from_the_text_form() {
        use serde::Deserialize;
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};
        let ok: StrDeserializer<'_, Error> = "0000:00:05.0".into_deserializer();
        assert_eq!(PciAddr::deserialize(ok).unwrap(), PciAddr::new(0, 0, 5, 0));
        let bad: StrDeserializer<'_, Error> = "gpu0".into_deserializer();
        assert!(PciAddr::deserialize(bad).is_err());
    }
}
