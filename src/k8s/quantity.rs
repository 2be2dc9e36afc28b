//! Exact parsing of Kubernetes resource quantities (`500m`, `1.5`, `128Mi`, `1e9`, `64G`).
//!
//! Quantities are decimal numbers with a binary (`Ki`..`Ei`), decimal SI (`n`..`E`) or exponent
//! (`e3`) suffix. They are parsed into an exact (mantissa, power of ten, power of two) triple and
//! scaled to integers the way the API server does (`Quantity.Value()`/`MilliValue()` round up),
//! so no value is ever rounded through a float.

use thiserror::Error;

/// Why a string is not a usable resource quantity.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    /// Empty string.
    #[error("empty quantity")]
    Empty,
    /// Not of the form `<number><suffix>`.
    #[error("not a Kubernetes quantity: {0}")]
    Syntax(&'static str),
    /// Resource quantities may not be negative.
    #[error("negative quantity")]
    Negative,
    /// Does not fit in 64 bits once scaled.
    #[error("quantity too large")]
    Overflow,
    /// Countable resources (GPUs, MIG instances, extended resources) must be whole numbers.
    #[error("must be a whole number")]
    NotWhole,
}

/// A parsed quantity: `mantissa * 10^exp10 * 2^exp2`, negated when `negative`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    /// Sign.
    pub negative: bool,
    /// Decimal digits without the point.
    pub mantissa: u128,
    /// Power of ten (the decimal point and SI/exponent suffixes).
    pub exp10: i32,
    /// Power of two (binary suffixes).
    pub exp2: u32,
}

impl Quantity {
    /// Parses a quantity string as the API server accepts it.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        let (negative, rest) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(num_end);
        if !number.bytes().any(|b| b.is_ascii_digit()) {
            return Err(QuantityError::Syntax("missing digits"));
        }
        if number.matches('.').count() > 1 {
            return Err(QuantityError::Syntax("more than one decimal point"));
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let mut mantissa: u128 = 0;
        for b in int_part.bytes().chain(frac_part.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(b - b'0')))
                .ok_or(QuantityError::Overflow)?;
        }
        let mut exp10 = -(frac_part.len() as i32);
        let mut exp2 = 0;
        match suffix {
            "" => {}
            "Ki" => exp2 = 10,
            "Mi" => exp2 = 20,
            "Gi" => exp2 = 30,
            "Ti" => exp2 = 40,
            "Pi" => exp2 = 50,
            "Ei" => exp2 = 60,
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            _ if suffix.starts_with(['e', 'E']) => {
                let exp = &suffix[1..];
                let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(QuantityError::Syntax("malformed exponent"));
                }
                let e: i32 = exp.parse().map_err(|_| QuantityError::Syntax("exponent out of range"))?;
                if e.abs() > 1000 {
                    return Err(QuantityError::Syntax("exponent out of range"));
                }
                exp10 += e;
            }
            _ => return Err(QuantityError::Syntax("unknown suffix")),
        }
        Ok(Self { negative: negative && mantissa != 0, mantissa, exp10, exp2 })
    }

    /// The value times `10^scale`, rounded up to an integer (`scale = 3` gives milli-units).
    pub fn scaled_ceil(&self, scale: i32) -> Result<u64, QuantityError> {
        if self.negative {
            return Err(QuantityError::Negative);
        }
        let (value, exact) = self.scaled(scale)?;
        Ok(if exact { value } else { value + 1 })
    }

    /// The value times `10^scale`, which must be a whole number.
    pub fn scaled_exact(&self, scale: i32) -> Result<u64, QuantityError> {
        if self.negative {
            return Err(QuantityError::Negative);
        }
        match self.scaled(scale)? {
            (value, true) => Ok(value),
            _ => Err(QuantityError::NotWhole),
        }
    }

    /// Floor of the scaled magnitude and whether it was exact.
    fn scaled(&self, scale: i32) -> Result<(u64, bool), QuantityError> {
        let num = self
            .mantissa
            .checked_mul(1u128 << self.exp2.min(127))
            .filter(|_| self.exp2 < 127)
            .ok_or(QuantityError::Overflow)?;
        let e = self.exp10 + scale;
        let (value, exact) = if e >= 0 {
            let p = 10u128.checked_pow(e as u32);
            match p.and_then(|p| num.checked_mul(p)) {
                Some(v) => (v, true),
                None if num == 0 => (0, true),
                None => return Err(QuantityError::Overflow),
            }
        } else {
            match 10u128.checked_pow(e.unsigned_abs()) {
                Some(den) => (num / den, num % den == 0),
                // Smaller than any representable unit.
                None => (0, num == 0),
            }
        };
        let value = u64::try_from(value).map_err(|_| QuantityError::Overflow)?;
        if !exact && value == u64::MAX {
            return Err(QuantityError::Overflow);
        }
        Ok((value, exact))
    }
}

/// CPU in milli-cores, rounded up like `MilliValue()`.
pub fn milli(s: &str) -> Result<u64, QuantityError> {
    Quantity::parse(s)?.scaled_ceil(3)
}

/// A quantity in base units (bytes for memory), rounded up like `Value()`.
pub fn units(s: &str) -> Result<u64, QuantityError> {
    Quantity::parse(s)?.scaled_ceil(0)
}

/// A whole count (GPUs, MIG instances, extended resources), as the API server requires them.
pub fn count(s: &str) -> Result<u64, QuantityError> {
    Quantity::parse(s)?.scaled_exact(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_in_milli() {
        assert_eq!(milli("500m"), Ok(500));
        assert_eq!(milli("2"), Ok(2000));
        assert_eq!(milli("1.5"), Ok(1500));
        assert_eq!(milli("0.1"), Ok(100));
        assert_eq!(milli("95"), Ok(95_000));
        assert_eq!(milli("7910m"), Ok(7910));
        assert_eq!(milli("+3"), Ok(3000));
        // Rounds up like MilliValue().
        assert_eq!(milli("1.0001"), Ok(1001));
        assert_eq!(milli("100u"), Ok(1));
        assert_eq!(milli("0"), Ok(0));
        assert_eq!(milli("1e3"), Ok(1_000_000));
    }

    #[test]
    fn memory_in_bytes() {
        assert_eq!(units("128Mi"), Ok(128 << 20));
        assert_eq!(units("1Gi"), Ok(1 << 30));
        assert_eq!(units("1e9"), Ok(1_000_000_000));
        assert_eq!(units("1E9"), Ok(1_000_000_000));
        assert_eq!(units("64G"), Ok(64_000_000_000));
        assert_eq!(units("100k"), Ok(100_000));
        assert_eq!(units("1.5Gi"), Ok(3 << 29));
        assert_eq!(units("2Ti"), Ok(2 << 40));
        assert_eq!(units("1E"), Ok(1_000_000_000_000_000_000));
        assert_eq!(units("1Ei"), Ok(1 << 60));
        assert_eq!(milli("2.5e-1"), Ok(250));
        assert!(matches!(units("2.5e-1k"), Err(QuantityError::Syntax(_))));
        assert_eq!(units("1180325636Ki"), Ok(1_180_325_636 * 1024));
        // Value() rounds up.
        assert_eq!(units("1500m"), Ok(2));
        assert_eq!(units("0.5"), Ok(1));
    }

    #[test]
    fn counts_must_be_whole() {
        assert_eq!(count("8"), Ok(8));
        assert_eq!(count("7"), Ok(7));
        assert_eq!(count("2000m"), Ok(2));
        assert_eq!(count("1k"), Ok(1000));
        assert_eq!(count("1.5"), Err(QuantityError::NotWhole));
        assert_eq!(count("500m"), Err(QuantityError::NotWhole));
    }

    #[test]
    fn rejects_malformed_and_negative() {
        assert_eq!(units(""), Err(QuantityError::Empty));
        assert!(matches!(units("abc"), Err(QuantityError::Syntax(_))));
        assert!(matches!(units("1.2.3"), Err(QuantityError::Syntax(_))));
        assert!(matches!(units("12KB"), Err(QuantityError::Syntax(_))));
        assert!(matches!(units("1K"), Err(QuantityError::Syntax(_))));
        assert!(matches!(units("1e"), Err(QuantityError::Syntax(_))));
        assert!(matches!(units("1e+"), Err(QuantityError::Syntax(_))));
        assert!(matches!(units("Mi"), Err(QuantityError::Syntax(_))));
        assert_eq!(units("-1"), Err(QuantityError::Negative));
        assert_eq!(units("-0"), Ok(0));
        assert_eq!(units("20Ei"), Err(QuantityError::Overflow));
        assert_eq!(units("1e30"), Err(QuantityError::Overflow));
        assert_eq!(units("1e-900"), Ok(1));
    }

    #[test]
    fn parsed_form_is_exact() {
        assert_eq!(
            Quantity::parse("1.25Gi"),
            Ok(Quantity { negative: false, mantissa: 125, exp10: -2, exp2: 30 })
        );
    }
}
