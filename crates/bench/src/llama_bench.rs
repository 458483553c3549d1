//! llama-bench's protocol around the measurements: test lists (`-p 64-512*2`), one result
//! row per model, thread count and test, and its outputs (markdown table, `-o json` with its
//! field names), so `quarrel bench` and llama-bench compare line by line.

use crate::mean_stddev;
use quarrel_gguf::Gguf;
use quarrel_models::Ftype;
use serde_json::{json, Value};

/// Errors in a test list.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ListError(String);

/// One test of one model and thread count.
pub struct Row {
    pub model_filename: String,
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub backend: String,
    pub n_threads: usize,
    pub n_batch: usize,
    pub kv_type: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub load_ms: f64,
    pub test_time: String,
    pub samples_ns: Vec<u64>,
}

impl Row {
    pub fn samples_ts(&self) -> Vec<f64> {
        let n = (self.n_prompt + self.n_gen) as f64;
        self.samples_ns.iter().map(|&ns| 1e9 * n / ns.max(1) as f64).collect()
    }

    pub fn test_name(&self) -> String {
        test_name(self.n_prompt, self.n_gen)
    }
}

pub fn test_name(pp: usize, tg: usize) -> String {
    match (pp, tg) {
        (p, 0) => format!("pp{p}"),
        (0, g) => format!("tg{g}"),
        (p, g) => format!("pp{p}+tg{g}"),
    }
}

/// llama-bench's list syntax: `first[-last[(+|*)step]]`, comma-separated.
pub fn parse_list(flag: &str, s: &str) -> Result<Vec<usize>, ListError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(ListError(format!("{flag}: empty list (give numbers such as `{flag} 1,2` or a range `{flag} 1-4`)")));
    }
    let mut out = vec![];
    for item in s.split(',') {
        let item = item.trim();
        let bad = || ListError(format!("{flag}: invalid value {item:?} in {s:?} (expected N, A-B, A-B+STEP or A-B*FACTOR)"));
        let num = |x: &str| x.trim().parse::<usize>().map_err(|_| bad());
        let (first, rest) = match item.split_once('-') {
            None => (num(item)?, None),
            Some((a, b)) => (num(a)?, Some(b)),
        };
        let Some(rest) = rest else {
            out.push(first);
            continue;
        };
        let (last, op, step) = if let Some((l, st)) = rest.split_once('+') {
            (num(l)?, '+', num(st)?)
        } else if let Some((l, st)) = rest.split_once('*') {
            (num(l)?, '*', num(st)?)
        } else {
            (num(rest)?, '+', 1)
        };
        if (op == '+' && step == 0) || (op == '*' && (step < 2 || first == 0)) {
            return Err(ListError(format!("{flag}: range {item:?} does not advance")));
        }
        let mut i = first;
        while i <= last {
            out.push(i);
            i = if op == '+' { i + step } else { i * step };
        }
    }
    Ok(out)
}

pub fn parse_all(flag: &str, vals: &[String], default: Vec<usize>) -> Result<Vec<usize>, ListError> {
    if vals.is_empty() {
        return Ok(default);
    }
    let mut out = vec![];
    for v in vals {
        out.extend(parse_list(flag, v)?);
    }
    Ok(out)
}

/// llama.cpp's model description: `{arch} {size} {file type}` (`llama 135M Q4_1`).
pub fn model_type(g: &Gguf, arch: &str, n_params: u64) -> String {
    let size = match g.get_str("general.size_label").ok().flatten() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ if n_params >= 1_000_000_000 => format!("{:.1}B", n_params as f64 / 1e9),
        _ => format!("{:.0}M", n_params as f64 / 1e6),
    };
    let ftype = g.get_u64("general.file_type").ok().flatten();
    let ft = match ftype.and_then(|f| Ftype::ALL.iter().find(|x| x.llama_ftype() as u64 == f)) {
        Some(f) => {
            let n = f.name().to_ascii_uppercase();
            match n.rsplit_once('_') {
                Some((b, "S")) if b.ends_with('K') => format!("{b} - Small"),
                Some((b, "M")) if b.ends_with('K') => format!("{b} - Medium"),
                Some((b, "L")) if b.ends_with('K') => format!("{b} - Large"),
                _ => n,
            }
        }
        None => match ftype {
            Some(f) => format!("ftype {f}"),
            None => "?".into(),
        },
    };
    format!("{arch} {size} {ft}")
}

fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_default()
}

/// Now as RFC 3339 UTC (`2025-01-31T12:34:56Z`), as llama-bench's test_time.
pub fn utc_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A markdown table with columns padded to their widest cell; `right[i]` right-aligns column i.
pub fn table<const N: usize>(head: &[&str; N], right: &[bool; N], rows: &[[String; N]]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let cell = |i: usize, c: &str| if right[i] { format!(" {c:>w$} |", w = w[i]) } else { format!(" {c:<w$} |", w = w[i]) };
    let mut s = String::from("|");
    for (i, h) in head.iter().enumerate() {
        s += &cell(i, h);
    }
    s += "\n|";
    for i in 0..N {
        s += &format!(" {}{} |", "-".repeat(w[i].saturating_sub(1)), if right[i] { ':' } else { '-' });
    }
    s += "\n";
    for r in rows {
        s += "|";
        for (i, c) in r.iter().enumerate() {
            s += &cell(i, c);
        }
        s += "\n";
    }
    s
}

pub fn markdown(rows: &[Row]) -> String {
    let lines: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            let (avg, sd) = mean_stddev(&r.samples_ts());
            let size = if r.model_size < 1 << 30 {
                format!("{:.2} MiB", r.model_size as f64 / (1u64 << 20) as f64)
            } else {
                format!("{:.2} GiB", r.model_size as f64 / (1u64 << 30) as f64)
            };
            let params = if r.model_n_params < 1_000_000_000 {
                format!("{:.2} M", r.model_n_params as f64 / 1e6)
            } else {
                format!("{:.2} B", r.model_n_params as f64 / 1e9)
            };
            // the backend's short name ("cpu"); its full description is in the footer
            let backend = r.backend.split(" (").next().unwrap_or_default().to_string();
            [r.model_type.clone(), size, params, backend, r.n_threads.to_string(), r.test_name(), format!("{avg:.2} ± {sd:.2}")]
        })
        .collect();
    let mut s =
        table(&["model", "size", "params", "backend", "threads", "test", "t/s"], &[false, true, true, false, true, true, true], &lines);
    // load times, one per model and thread count, outside the t/s table
    s.push('\n');
    let mut seen = vec![];
    for r in rows {
        let key = (r.model_filename.clone(), r.n_threads);
        if !seen.contains(&key) {
            s += &format!("load: {} ({} threads): {:.1} ms on {}\n", r.model_filename, r.n_threads, r.load_ms, r.backend);
            seen.push(key);
        }
    }
    s += &format!("build: {} (quarrel {})\n", build_commit(), env!("CARGO_PKG_VERSION"));
    s
}

fn build_commit() -> &'static str {
    env!("QUARREL_BUILD_COMMIT")
}

/// llama-bench's `-o json`: a list of objects with its field names, in its order.
pub fn json_list(rows: &[Row]) -> String {
    let cpu = cpu_info();
    let objs: Vec<String> = rows
        .iter()
        .map(|r| {
            let ts = r.samples_ts();
            let (avg_ts, sd_ts) = mean_stddev(&ts);
            let ns: Vec<f64> = r.samples_ns.iter().map(|&x| x as f64).collect();
            let (avg_ns, sd_ns) = mean_stddev(&ns);
            let fields: Vec<(&str, Value)> = vec![
                ("build_commit", json!(build_commit())),
                ("build_number", json!(0)),
                ("quarrel_version", json!(env!("CARGO_PKG_VERSION"))),
                ("cpu_info", json!(cpu)),
                ("gpu_info", json!("")),
                ("backends", json!("CPU")),
                ("backend", json!(r.backend)),
                ("model_filename", json!(r.model_filename)),
                ("model_type", json!(r.model_type)),
                ("model_size", json!(r.model_size)),
                ("model_n_params", json!(r.model_n_params)),
                ("n_batch", json!(r.n_batch)),
                ("n_ubatch", json!(r.n_batch)),
                ("n_threads", json!(r.n_threads)),
                ("type_k", json!(r.kv_type)),
                ("type_v", json!(r.kv_type)),
                ("n_gpu_layers", json!(0)),
                ("n_prompt", json!(r.n_prompt)),
                ("n_gen", json!(r.n_gen)),
                ("n_depth", json!(0)),
                ("test_time", json!(r.test_time)),
                ("load_ms", json!(r.load_ms)),
                ("avg_ns", json!(avg_ns.round() as u64)),
                ("stddev_ns", json!(sd_ns.round() as u64)),
                ("avg_ts", json!(avg_ts)),
                ("stddev_ts", json!(sd_ts)),
                ("samples_ns", json!(r.samples_ns)),
                ("samples_ts", json!(ts)),
            ];
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("    {}: {}", json!(k), v)).collect();
            format!("  {{\n{}\n  }}", body.join(",\n"))
        })
        .collect();
    format!("[\n{}\n]\n", objs.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse_list("-t", "1,2").unwrap(), vec![1, 2]);
        assert_eq!(parse_list("-t", "1-4").unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(parse_list("-p", "64-512*2").unwrap(), vec![64, 128, 256, 512]);
        assert_eq!(parse_list("-p", "0-10+5,7").unwrap(), vec![0, 5, 10, 7]);
        assert!(parse_list("-t", "").is_err());
        assert!(parse_list("-t", "1,,2").is_err());
        assert!(parse_list("-t", "x").is_err());
        assert!(parse_list("-t", "1-4+0").is_err());
        assert!(parse_list("-t", "0-4*2").is_err());
    }

    #[test]
    fn dates() {
        let s = utc_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z'));
    }

    #[test]
    fn markdown_table_aligns() {
        let t = table(&["a", "bb"], &[false, true], &[["xyz".into(), "1 ± 2".into()]]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "| a   |    bb |");
        assert_eq!(lines[1], "| --- | ----: |");
        assert_eq!(lines[2], "| xyz | 1 ± 2 |");
    }
}
