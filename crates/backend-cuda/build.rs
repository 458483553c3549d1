//! Derives the kernel registry from the kernel sources: every `extern "C" __global__` kernel of
//! `kernels/*.cu` and `kernels/*.cuh`, literal or stamped out by a macro, with whether its body
//! waits for the previous launch (so it may be launched with programmatic dependent launch).
//! Writes `$OUT_DIR/kernel_registry.rs`, which `src/kernels.rs` includes.
//!
//! The scan is a small preprocessor: line continuations joined, comments removed, the `#`
//! directives set aside (the function-like `#define`s kept as macros), and every invocation of
//! a macro that (through other macros) defines a kernel expanded with `##` pasting. A macro
//! defined in several `#if` branches is expanded with each definition: the registry is the
//! union over the compiled units, which each see one branch. A kernel waits when its body
//! holds `griddepcontrol.wait` or calls a function or macro that does, transitively (`GDC()`
//! of common.cuh calls `gdc_wait()`).

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

/// A `#define`: parameters (None for an object-like macro) and replacement text.
struct Macro {
    params: Option<Vec<String>>,
    body: String,
}

/// A function definition of the expanded top-level text.
struct Function {
    file: String,
    name: String,
    kernel: bool,
    body: String,
}

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    let dir = Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("kernels");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("the kernels folder")
        .map(|e| e.expect("a kernels folder entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu" || x == "cuh"))
        .map(|p| {
            let name = p.file_name().expect("a file name").to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, text)
        })
        .collect();
    files.sort();

    let mut macros: BTreeMap<String, Vec<Macro>> = BTreeMap::new();
    let mut code = Vec::new();
    for (name, text) in &files {
        let (top, defs) = split_directives(&strip_comments(&text.replace("\\\r\n", "").replace("\\\n", "")));
        for (n, m) in defs {
            macros.entry(n).or_default().push(m);
        }
        code.push((name.clone(), top));
    }
    let kernel_macros = kernel_macros(&macros);

    let mut functions = Vec::new();
    for (file, top) in &code {
        functions.extend(functions_of(file, &expand(top, &macros, &kernel_macros, 0)));
    }

    // fixed point: the functions and macros that wait, directly or through a call
    let mut waiting: HashSet<String> = HashSet::new();
    loop {
        let before = waiting.len();
        for f in &functions {
            if !waiting.contains(&f.name) && waits(&f.body, &waiting) {
                waiting.insert(f.name.clone());
            }
        }
        for (n, defs) in &macros {
            if !waiting.contains(n) && defs.iter().any(|m| waits(&m.body, &waiting)) {
                waiting.insert(n.clone());
            }
        }
        if waiting.len() == before {
            break;
        }
    }

    let mut out = String::from("/// Every kernel of the sources: (source file, kernel, whether it waits for its predecessor).\n");
    out.push_str("pub const KERNELS: &[(&str, &str, bool)] = &[\n");
    let mut seen: BTreeMap<String, bool> = BTreeMap::new();
    for f in functions.iter().filter(|f| f.kernel) {
        let w = waits(&f.body, &waiting);
        match seen.get(&f.name) {
            Some(&prev) => assert_eq!(prev, w, "kernel {} is defined twice with different waits", f.name),
            None => {
                seen.insert(f.name.clone(), w);
                writeln!(out, "    ({:?}, {:?}, {w}),", f.file, f.name).expect("writing to a String");
            }
        }
    }
    out.push_str("];\n");
    assert!(seen.len() > 100, "the scan found only {} kernels", seen.len());
    let dest = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("kernel_registry.rs");
    std::fs::write(&dest, out).unwrap_or_else(|e| panic!("{}: {e}", dest.display()));
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The text without `//` and `/* */` comments (string and character literals kept whole).
fn strip_comments(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            '/' if b.get(i + 1) == Some(&'/') => {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
            }
            '/' if b.get(i + 1) == Some(&'*') => {
                i += 2;
                while i < b.len() && !(b[i] == '*' && b.get(i + 1) == Some(&'/')) {
                    i += 1;
                }
                i += 2;
                out.push(' ');
            }
            q @ ('"' | '\'') => {
                out.push(q);
                i += 1;
                while i < b.len() && b[i] != q {
                    if b[i] == '\\' && i + 1 < b.len() {
                        out.push(b[i]);
                        i += 1;
                    }
                    out.push(b[i]);
                    i += 1;
                }
                if i < b.len() {
                    out.push(q);
                    i += 1;
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// The code without its directive lines, and the `#define`s among those lines.
fn split_directives(src: &str) -> (String, Vec<(String, Macro)>) {
    let mut top = String::new();
    let mut defs = Vec::new();
    for line in src.lines() {
        let t = line.trim_start();
        if !t.starts_with('#') {
            top.push_str(line);
            top.push('\n');
            continue;
        }
        top.push('\n');
        let Some(rest) = t[1..].trim_start().strip_prefix("define") else { continue };
        let rest = rest.trim_start();
        let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        let after = &rest[name.len()..];
        let m = match after.strip_prefix('(') {
            Some(p) => {
                let close = p.find(')').expect("a macro's parameter list closes");
                let params = p[..close].split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
                Macro { params: Some(params), body: p[close + 1..].trim().to_string() }
            }
            None => Macro { params: None, body: after.trim().to_string() },
        };
        defs.push((name, m));
    }
    (top, defs)
}

/// The function-like macros whose expansion defines a kernel.
fn kernel_macros(macros: &BTreeMap<String, Vec<Macro>>) -> HashSet<String> {
    let mut set: HashSet<String> = HashSet::new();
    loop {
        let before = set.len();
        for (n, defs) in macros {
            let makes = defs
                .iter()
                .any(|m| m.params.is_some() && (m.body.contains("__global__") || idents(&m.body).any(|(_, id)| set.contains(id))));
            if makes {
                set.insert(n.clone());
            }
        }
        if set.len() == before {
            return set;
        }
    }
}

/// `(byte offset, identifier)` of every identifier of `s` (numbers skipped).
fn idents(s: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < s.len() {
            let c = s[at..].chars().next()?;
            if is_ident(c) {
                let start = at;
                let len = s[at..].find(|c: char| !is_ident(c)).unwrap_or(s.len() - at);
                at += len;
                if !c.is_ascii_digit() {
                    return Some((start, &s[start..at]));
                }
            } else {
                at += c.len_utf8();
            }
        }
        None
    })
}

/// The arguments of the parenthesised list opening at `s[0]`, and the length of that list.
fn args(s: &str) -> (Vec<String>, usize) {
    let mut depth = 0;
    let mut out = vec![];
    let mut cur = String::new();
    for (i, c) in s.char_indices() {
        match c {
            '(' => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            ')' => {
                depth -= 1;
                if depth == 0 {
                    out.push(cur.trim().to_string());
                    return (out, i + 1);
                }
            }
            ',' if depth == 1 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    panic!("an unclosed macro argument list")
}

/// `text` with every invocation of a kernel-defining macro expanded (each of its definitions).
fn expand(text: &str, macros: &BTreeMap<String, Vec<Macro>>, kernel: &HashSet<String>, depth: usize) -> String {
    assert!(depth < 32, "macro expansion too deep");
    let mut out = String::new();
    let mut copied = 0;
    let mut skip_to = 0;
    for (at, id) in idents(text) {
        if at < skip_to || !kernel.contains(id) {
            continue;
        }
        let rest = &text[at + id.len()..];
        let Some(paren) = rest.find(|c: char| !c.is_whitespace()).filter(|&p| rest[p..].starts_with('(')) else { continue };
        let (a, len) = args(&rest[paren..]);
        out.push_str(&text[copied..at]);
        for m in &macros[id] {
            let Some(params) = &m.params else { continue };
            let mut body = String::new();
            let mut last = 0;
            for (p, word) in idents(&m.body) {
                if let Some(k) = params.iter().position(|q| q == word) {
                    body.push_str(&m.body[last..p]);
                    body.push_str(a.get(k).map_or("", String::as_str));
                    last = p + word.len();
                }
            }
            body.push_str(&m.body[last..]);
            let pasted = body.split("##").map(str::trim).collect::<Vec<_>>().join("");
            out.push_str(&expand(&pasted, macros, kernel, depth + 1));
            out.push('\n');
        }
        copied = at + id.len() + paren + len;
        skip_to = copied;
    }
    out.push_str(&text[copied..]);
    out
}

/// The functions defined at the top level of expanded code (a `{` at depth 0 after a `)`).
fn functions_of(file: &str, code: &str) -> Vec<Function> {
    let mut out = vec![];
    let b = code.as_bytes();
    let mut depth = 0usize;
    let mut head_from = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' if depth == 0 => {
                let close = matching_brace(code, i);
                let head = &code[head_from..i];
                let h = head.trim_end().trim_end_matches("const").trim_end();
                if h.ends_with(')') {
                    // the identifier before the parameter list's `(`
                    let mut d = 0;
                    let mut open = h.len();
                    for (k, c) in h.char_indices().rev() {
                        d += (c == ')') as i32 - (c == '(') as i32;
                        if d == 0 {
                            open = k;
                            break;
                        }
                    }
                    let name: String =
                        h[..open].trim_end().chars().rev().take_while(|&c| is_ident(c)).collect::<String>().chars().rev().collect();
                    if !name.is_empty() {
                        let kernel = head.contains("__global__") && head.contains("extern \"C\"");
                        out.push(Function { file: file.to_string(), name, kernel, body: code[i..=close].to_string() });
                        i = close + 1;
                        head_from = i;
                        continue;
                    }
                }
                // a struct, namespace or initializer: its inside is scanned as top level
                depth += 1;
                head_from = i + 1;
            }
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                head_from = i + 1;
            }
            b';' => head_from = i + 1,
            _ => {}
        }
        i += 1;
    }
    out
}

/// The offset of the `}` matching the `{` at `open`.
fn matching_brace(s: &str, open: usize) -> usize {
    let mut d = 0;
    for (k, c) in s[open..].char_indices() {
        match c {
            '{' => d += 1,
            '}' => {
                d -= 1;
                if d == 0 {
                    return open + k;
                }
            }
            _ => {}
        }
    }
    panic!("an unclosed function body")
}

/// Whether `body` waits: holds `griddepcontrol.wait` or calls (`name(` or `name<`) a waiting name.
fn waits(body: &str, waiting: &HashSet<String>) -> bool {
    body.contains("griddepcontrol.wait")
        || idents(body).any(|(at, id)| waiting.contains(id) && body[at + id.len()..].trim_start().starts_with(['(', '<']))
}
