//! llama.cpp GBNF grammars rewritten in llguidance's Lark dialect.
//!
//! GBNF: `name ::= body` rules (the one named `root` is the start), string literals with
//! C-like escapes (`\n`, `\x7F`, `\u2028`, `\U0001F600`), character classes `[^a-z\x00]`,
//! `.` for any character, grouping, `|`, `*` `+` `?` and `{m}` `{m,}` `{m,n}` `{,n}`,
//! `#` comments, empty alternatives (`ws ::= | " "`), rules spanning lines.
//!
//! Lark here: rule names are lower case, so each GBNF name is encoded (`dataType` ->
//! `g-data_type`, a `g-` prefix so no name meets a Lark keyword); strings are written
//! as JSON strings, classes as regexes with every non-alphanumeric character escaped by
//! code point; each rule on one line. An empty alternative becomes `""`.

use std::fmt::Write;

#[derive(Debug, PartialEq)]
enum Tok {
    Name(String),
    Define,
    Str(String),
    /// A character class, already a regex (`[...]`).
    Class(String),
    Any,
    Punct(char),
    /// `{m,n}` as written after normalizing (`{2}`, `{2,}`, `{2,5}`, `{,5}`).
    Repeat(String),
}

fn err<T>(pos: usize, msg: &str) -> Result<T, String> {
    Err(format!("GBNF grammar, at byte {pos}: {msg}"))
}

/// One escaped character after a backslash at `chars[*i]` (the backslash already taken).
fn escape(chars: &[(usize, char)], i: &mut usize) -> Result<char, String> {
    let Some(&(pos, c)) = chars.get(*i) else { return err(chars.last().map_or(0, |c| c.0), "the grammar ends in an escape") };
    *i += 1;
    let hex = |n: usize, i: &mut usize| -> Result<char, String> {
        let digits: String = chars.get(*i..*i + n).map(|s| s.iter().map(|c| c.1).collect()).unwrap_or_default();
        *i += n;
        u32::from_str_radix(&digits, 16)
            .ok()
            .filter(|_| digits.len() == n)
            .and_then(char::from_u32)
            .map_or_else(|| err(pos, &format!("bad \\{c} escape {digits:?}")), Ok)
    };
    Ok(match c {
        'n' => '\n',
        'r' => '\r',
        't' => '\t',
        '0' => '\0',
        'x' => hex(2, i)?,
        'u' => hex(4, i)?,
        'U' => hex(8, i)?,
        '\\' | '"' | '[' | ']' | '-' | '^' | '/' => c,
        _ => return err(pos, &format!("unknown escape \\{c}")),
    })
}

/// A character as a regex class member: alphanumerics as they are, anything else by code
/// point (no character is special then).
fn class_char(c: char, out: &mut String) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{{{:X}}}", c as u32);
    }
}

fn lex(src: &str) -> Result<Vec<(usize, Tok)>, String> {
    let chars: Vec<(usize, char)> = src.char_indices().collect();
    let mut out = vec![];
    let mut i = 0;
    while let Some(&(pos, c)) = chars.get(i) {
        i += 1;
        match c {
            c if c.is_whitespace() => {}
            '#' => {
                while chars.get(i).is_some_and(|c| c.1 != '\n') {
                    i += 1;
                }
            }
            ':' if chars.get(i).map(|c| c.1) == Some(':') && chars.get(i + 1).map(|c| c.1) == Some('=') => {
                i += 2;
                out.push((pos, Tok::Define));
            }
            '"' => {
                let mut s = String::new();
                loop {
                    match chars.get(i) {
                        None => return err(pos, "unterminated string"),
                        Some(&(_, '"')) => {
                            i += 1;
                            break;
                        }
                        Some(&(_, '\\')) => {
                            i += 1;
                            s.push(escape(&chars, &mut i)?);
                        }
                        Some(&(_, c)) => {
                            i += 1;
                            s.push(c);
                        }
                    }
                }
                out.push((pos, Tok::Str(s)));
            }
            '[' => {
                let mut rx = String::from("[");
                if chars.get(i).map(|c| c.1) == Some('^') {
                    rx.push('^');
                    i += 1;
                }
                let mut members = 0;
                loop {
                    let c = match chars.get(i) {
                        None => return err(pos, "unterminated character class"),
                        Some(&(_, ']')) => {
                            i += 1;
                            break;
                        }
                        Some(&(_, '\\')) => {
                            i += 1;
                            escape(&chars, &mut i)?
                        }
                        Some(&(_, c)) => {
                            i += 1;
                            c
                        }
                    };
                    class_char(c, &mut rx);
                    members += 1;
                    // a range: `a-z` (a `-` right before `]` is a literal)
                    if chars.get(i).map(|c| c.1) == Some('-') && chars.get(i + 1).is_some_and(|c| c.1 != ']') {
                        i += 1;
                        let hi = match chars.get(i) {
                            Some(&(_, '\\')) => {
                                i += 1;
                                escape(&chars, &mut i)?
                            }
                            Some(&(_, c)) => {
                                i += 1;
                                c
                            }
                            None => return err(pos, "unterminated character class"),
                        };
                        if hi < c {
                            return err(pos, &format!("character range {c:?}-{hi:?} is reversed"));
                        }
                        rx.push('-');
                        class_char(hi, &mut rx);
                    }
                }
                if members == 0 {
                    return err(pos, "empty character class");
                }
                rx.push(']');
                out.push((pos, Tok::Class(rx)));
            }
            '{' => {
                let mut body = String::new();
                loop {
                    match chars.get(i) {
                        None => return err(pos, "unterminated repetition {...}"),
                        Some(&(_, '}')) => {
                            i += 1;
                            break;
                        }
                        Some(&(_, c)) => {
                            i += 1;
                            if !c.is_whitespace() {
                                body.push(c);
                            }
                        }
                    }
                }
                let (lo, hi) = body.split_once(',').map_or((body.as_str(), Some(body.as_str())), |(a, b)| (a, Some(b)));
                let num = |s: &str| s.is_empty() || s.parse::<u32>().is_ok();
                if !num(lo) || !hi.is_none_or(num) || (lo.is_empty() && hi.is_none_or(str::is_empty)) {
                    return err(pos, &format!("bad repetition {{{body}}}"));
                }
                if let (Ok(a), Some(Ok(b))) = (lo.parse::<u32>(), hi.map(str::parse::<u32>)) {
                    if b < a {
                        return err(pos, &format!("repetition {{{body}}}: the maximum is below the minimum"));
                    }
                }
                out.push((pos, Tok::Repeat(format!("{{{body}}}"))));
            }
            '.' => out.push((pos, Tok::Any)),
            '(' | ')' | '|' | '*' | '+' | '?' => out.push((pos, Tok::Punct(c))),
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let mut name = String::from(c);
                while let Some(&(_, c)) = chars.get(i).filter(|c| c.1.is_ascii_alphanumeric() || c.1 == '-' || c.1 == '_') {
                    name.push(c);
                    i += 1;
                }
                out.push((pos, Tok::Name(name)));
            }
            _ => return err(pos, &format!("unexpected character {c:?}")),
        }
    }
    Ok(out)
}

/// A GBNF rule name as a Lark rule name (lower case letters, digits, `_`, `-`).
fn rule_name(name: &str) -> String {
    let mut out = String::from("g-");
    for c in name.chars() {
        match c {
            'A'..='Z' => {
                out.push('_');
                out.push(c.to_ascii_lowercase());
            }
            '_' => out.push_str("__"),
            c => out.push(c),
        }
    }
    out
}

/// Rewrite a GBNF grammar as Lark; errors name the byte offset and what is wrong.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let toks = lex(src)?;
    let mut out = String::new();
    let mut defined = std::collections::HashSet::new();
    let mut used = vec![];
    let mut i = 0;
    while i < toks.len() {
        let (pos, Tok::Name(name)) = &toks[i] else { return err(toks[i].0, "expected a rule `name ::= ...`") };
        if toks.get(i + 1).map(|t| &t.1) != Some(&Tok::Define) {
            return err(*pos, &format!("expected `::=` after the rule name {name}"));
        }
        if !defined.insert(name.clone()) {
            return err(*pos, &format!("rule {name} is defined twice"));
        }
        i += 2;
        let _ = write!(out, "{}:", rule_name(name));
        // the body runs to the next `name ::=`
        let mut depth = 0i32;
        let mut alt_empty = true;
        while i < toks.len() && !(matches!(toks[i].1, Tok::Name(_)) && toks.get(i + 1).map(|t| &t.1) == Some(&Tok::Define)) {
            let (p, t) = &toks[i];
            match t {
                Tok::Name(n) => {
                    used.push((*p, n.clone()));
                    let _ = write!(out, " {}", rule_name(n));
                }
                Tok::Define => return err(*p, "`::=` without a rule name before it"),
                Tok::Str(s) => {
                    let _ = write!(out, " {}", serde_json::to_string(s).unwrap_or_default());
                }
                Tok::Class(rx) => {
                    let _ = write!(out, " /{rx}/");
                }
                Tok::Any => out.push_str(" /(?s:.)/"),
                Tok::Repeat(r) => out.push_str(r),
                &Tok::Punct(c) => {
                    if matches!(c, '|' | ')') && alt_empty {
                        out.push_str(" \"\"");
                    }
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    if depth < 0 {
                        return err(*p, "unbalanced `)`");
                    }
                    if matches!(c, '*' | '+' | '?') {
                        out.push(c);
                    } else {
                        let _ = write!(out, " {c}");
                    }
                }
            }
            alt_empty = matches!(t, Tok::Punct('|' | '('));
            i += 1;
        }
        if depth != 0 {
            return err(*pos, &format!("unbalanced `(` in rule {name}"));
        }
        if alt_empty {
            out.push_str(" \"\"");
        }
        out.push('\n');
    }
    if let Some((p, n)) = used.iter().find(|(_, n)| !defined.contains(n)) {
        return err(*p, &format!("rule {n} is used but not defined"));
    }
    if !defined.contains("root") {
        return Err("GBNF grammar: no `root` rule".into());
    }
    out.push_str("start: g-root\n");
    Ok(out)
}
