//! Codepoint classification exactly as llama.cpp's `unicode.cpp` sees it, and the
//! GPT-2 byte <-> unicode mapping used by byte-level BPE.
//!
//! llama.cpp classifies every codepoint into one coarse category (`\p{L}`, `\p{N}`, ...)
//! using tables generated from Unicode 15.1, plus a separate whitespace set. We take the
//! general category from `unicode-general-category` (Unicode 16.0) and mark the codepoints
//! that were first assigned in 16.0 as undefined, which reproduces llama.cpp's table
//! exactly (verified codepoint by codepoint against llama.cpp's `unicode-data.cpp`).

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// `$name(self) -> bool` for each flag `$bit`: whether it is set.
macro_rules! has_flag {
    ($($name:ident: $bit:ident),*) => {$(
        #[inline]
        pub fn $name(self) -> bool {
            self.0 & Self::$bit != 0
        }
    )*};
}

/// Category and helper bits, same values as llama.cpp's `unicode_cpt_flags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(pub u16);

impl Flags {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const SEPARATOR: u16 = 0x0008;
    pub const MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const CONTROL: u16 = 0x0080;
    pub const WHITESPACE: u16 = 0x0100;

    /// No flags at all: what llama.cpp returns for a position outside the current segment.
    pub const OUT: Flags = Flags(0);

    has_flag!(
        is_letter: LETTER,
        is_number: NUMBER,
        is_mark: MARK,
        is_whitespace: WHITESPACE,
        is_punctuation: PUNCTUATION,
        is_symbol: SYMBOL,
        is_control: CONTROL
    );
    /// Any flag set, i.e. "a codepoint inside the segment" (llama.cpp's `as_uint() != 0`).
    #[inline]
    pub fn any(self) -> bool {
        self.0 != 0
    }
    /// The category bits only (llama.cpp's `category_flag()`).
    #[inline]
    pub fn category(self) -> u16 {
        self.0 & 0x00FF
    }
}

/// Codepoints assigned in Unicode 16.0 (inclusive ranges): undefined in llama.cpp's 15.1 tables.
const NEW_IN_UNICODE_16: &[(u32, u32)] = &[
    (0x00897, 0x00897),
    (0x01B4E, 0x01B4F),
    (0x01B7F, 0x01B7F),
    (0x01C89, 0x01C8A),
    (0x02427, 0x02429),
    (0x031E4, 0x031E5),
    (0x0A7CB, 0x0A7CD),
    (0x0A7DA, 0x0A7DC),
    (0x105C0, 0x105F3),
    (0x10D40, 0x10D65),
    (0x10D69, 0x10D85),
    (0x10D8E, 0x10D8F),
    (0x10EC2, 0x10EC4),
    (0x10EFC, 0x10EFC),
    (0x11380, 0x11389),
    (0x1138B, 0x1138B),
    (0x1138E, 0x1138E),
    (0x11390, 0x113B5),
    (0x113B7, 0x113C0),
    (0x113C2, 0x113C2),
    (0x113C5, 0x113C5),
    (0x113C7, 0x113CA),
    (0x113CC, 0x113D5),
    (0x113D7, 0x113D8),
    (0x113E1, 0x113E2),
    (0x116D0, 0x116E3),
    (0x11BC0, 0x11BE1),
    (0x11BF0, 0x11BF9),
    (0x11F5A, 0x11F5A),
    (0x13460, 0x143FA),
    (0x16100, 0x16139),
    (0x16D40, 0x16D79),
    (0x18CFF, 0x18CFF),
    (0x1CC00, 0x1CCF9),
    (0x1CD00, 0x1CEB3),
    (0x1E5D0, 0x1E5FA),
    (0x1E5FF, 0x1E5FF),
    (0x1F8B2, 0x1F8BB),
    (0x1F8C0, 0x1F8C1),
    (0x1FA89, 0x1FA89),
    (0x1FA8F, 0x1FA8F),
    (0x1FABE, 0x1FABE),
    (0x1FAC6, 0x1FAC6),
    (0x1FADC, 0x1FADC),
    (0x1FADF, 0x1FADF),
    (0x1FAE9, 0x1FAE9),
    (0x1FBCB, 0x1FBEF),
];

/// llama.cpp's whitespace set (the Unicode White_Space property).
#[inline]
pub(crate) fn is_whitespace(c: u32) -> bool {
    matches!(c, 0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000)
}

fn category_flag(c: char) -> u16 {
    let cp = c as u32;
    if cp >= 0x897 {
        let i = NEW_IN_UNICODE_16.partition_point(|&(_, hi)| hi < cp);
        if i < NEW_IN_UNICODE_16.len() && NEW_IN_UNICODE_16[i].0 <= cp {
            return Flags::UNDEFINED;
        }
    }
    match get_general_category(c) {
        G::Control | G::Format | G::PrivateUse | G::Surrogate => Flags::CONTROL,
        G::LowercaseLetter | G::ModifierLetter | G::OtherLetter | G::TitlecaseLetter | G::UppercaseLetter => Flags::LETTER,
        G::SpacingMark | G::EnclosingMark | G::NonspacingMark => Flags::MARK,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => Flags::NUMBER,
        G::ConnectorPunctuation
        | G::DashPunctuation
        | G::ClosePunctuation
        | G::FinalPunctuation
        | G::InitialPunctuation
        | G::OtherPunctuation
        | G::OpenPunctuation => Flags::PUNCTUATION,
        G::CurrencySymbol | G::ModifierSymbol | G::MathSymbol | G::OtherSymbol => Flags::SYMBOL,
        G::LineSeparator | G::ParagraphSeparator | G::SpaceSeparator => Flags::SEPARATOR,
        _ => Flags::UNDEFINED,
    }
}

/// The flags llama.cpp assigns to a codepoint (category + whitespace bit).
#[inline]
pub(crate) fn flags(c: char) -> Flags {
    let ws = if is_whitespace(c as u32) { Flags::WHITESPACE } else { 0 };
    Flags(category_flag(c) | ws)
}

/// GPT-2's `bytes_to_unicode`: every byte maps to a printable codepoint.
pub(crate) const fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        table[b] = if printable {
            match char::from_u32(b as u32) {
                Some(c) => c,
                None => '\0',
            }
        } else {
            let c = match char::from_u32(256 + n) {
                Some(c) => c,
                None => '\0',
            };
            n += 1;
            c
        };
        b += 1;
    }
    table
}

pub(crate) static BYTE_TO_CHAR: [char; 256] = BYTE_TO_CHAR_CONST;

const fn char_to_byte_table() -> [i16; 0x144] {
    let mut inv = [-1i16; 0x144];
    let mut b = 0usize;
    while b < 256 {
        let c = BYTE_TO_CHAR_CONST[b] as usize;
        if c < 0x144 {
            inv[c] = b as i16;
        }
        b += 1;
    }
    inv
}

const BYTE_TO_CHAR_CONST: [char; 256] = byte_to_char_table();
static CHAR_TO_BYTE: [i16; 0x144] = char_to_byte_table();

/// Inverse of [`BYTE_TO_CHAR`]: the byte a mapped codepoint stands for.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as usize;
    if cp < CHAR_TO_BYTE.len() && CHAR_TO_BYTE[cp] >= 0 {
        Some(CHAR_TO_BYTE[cp] as u8)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_roundtrip() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
    }

    #[test]
    fn categories() {
        assert!(flags('a').is_letter());
        assert!(flags('中').is_letter());
        assert!(flags('7').is_number());
        assert!(flags('٣').is_number());
        assert!(flags('\u{3000}').is_whitespace());
        assert!(flags('\u{0301}').is_mark());
        assert_eq!(flags('\u{1C89}').category(), Flags::UNDEFINED);
        assert_eq!(flags('\u{2EBF0}').category(), Flags::LETTER); // CJK ext. I, Unicode 15.1
    }

    /// Compares against llama.cpp's generated table (`src/unicode-data.cpp` of its source, path
    /// in `QUARREL_LLAMA_UNICODE_DATA`): `cargo test -p quarrel-tokenizer -- --ignored`.
    #[test]
    #[ignore = "needs llama.cpp's src/unicode-data.cpp (QUARREL_LLAMA_UNICODE_DATA)"]
    fn matches_llama_cpp_table() {
        let path = std::env::var("QUARREL_LLAMA_UNICODE_DATA").expect("QUARREL_LLAMA_UNICODE_DATA names llama.cpp's src/unicode-data.cpp");
        let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let a = src.find("unicode_ranges_flags").expect("the flags table");
        let b = src.find("unicode_set_whitespace").expect("the end of the flags table");
        let mut ranges = vec![];
        for line in src[a..b].lines() {
            if let Some(l) = line.strip_prefix("{0x") {
                let parts: Vec<&str> = l.trim_end_matches("},").split(", 0x").collect();
                ranges.push((u32::from_str_radix(parts[0], 16).unwrap(), u16::from_str_radix(parts[1], 16).unwrap()));
            }
        }
        assert!(ranges.len() > 100, "{} ranges parsed from {path}", ranges.len());
        for w in ranges.windows(2) {
            for cp in w[0].0..w[1].0 {
                if let Some(c) = char::from_u32(cp) {
                    assert_eq!(category_flag(c), w[0].1, "codepoint {cp:#x}");
                }
            }
        }
    }
}
