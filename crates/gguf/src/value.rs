//! Metadata values: every GGUF value type, nested arrays included.

use std::fmt;

/// `ValueType` with the variants listed, numbered 0.. in that order (the file's type ids are
/// 0..=12 without gaps), and `BY_ID`, every type at the index of its id.
macro_rules! value_types {
    ($($t:ident),*) => {
        /// GGUF metadata value type ids as stored in the file.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u32)]
        pub enum ValueType {
            $($t),*
        }

        impl ValueType {
            const BY_ID: &'static [ValueType] = &[$(ValueType::$t),*];
        }
    };
}

value_types!(U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64);

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        Self::BY_ID.get(id as usize).copied()
    }

    /// The smallest number of bytes one value of this type occupies in a file
    /// (used to reject absurd counts before allocating).
    pub fn min_size(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// An array: its element type (kept so empty arrays round-trip) and its items.
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type as i64 (u64 beyond i64::MAX gives None).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v as i64,
            Value::I8(v) => v as i64,
            Value::U16(v) => v as i64,
            Value::I16(v) => v as i64,
            Value::U32(v) => v as i64,
            Value::I32(v) => v as i64,
            Value::U64(v) => i64::try_from(v).ok()?,
            Value::I64(v) => v,
            Value::Bool(v) => v as i64,
            _ => return None,
        })
    }

    /// Any non-negative integer as u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// Any number as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }

    /// A short description of the type for error messages ("array of string", "u32").
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(t, _) => format!("array of {t:?}").to_lowercase(),
            v => format!("{:?}", v.value_type()).to_lowercase(),
        }
    }
}

impl fmt::Display for Value {
    /// Human-readable form; long arrays are abbreviated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => {
                let mut t: String = s.chars().take(80).collect();
                if t.len() < s.len() {
                    t.push('…');
                }
                write!(f, "{t:?}")
            }
            Value::Array(_, items) => {
                write!(f, "[")?;
                for (i, v) in items.iter().take(6).enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{v}")?;
                }
                if items.len() > 6 {
                    write!(f, ", … ({} items)", items.len())?;
                }
                write!(f, "]")
            }
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_round_trip() {
        for id in 0..13u32 {
            assert_eq!(ValueType::from_id(id).map(|t| t as u32), Some(id));
        }
        assert_eq!(ValueType::from_id(13), None);
        assert_eq!(ValueType::from_id(u32::MAX), None);
    }
}
