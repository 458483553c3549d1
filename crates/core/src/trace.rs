//! Named intermediates: `trace("attn_norm", layer, &values)` records a tensor summary when
//! `QUARREL_TRACE` is set, so a golden diff can name the first layer that diverges. A cheap
//! no-op otherwise. The only variable this crate reads, parsed once here.
//!
//! `QUARREL_TRACE` is a comma-separated list: tensor names to trace (or `all`), plus options
//! - `row=<width>`: also each row's sum and sum of squares (per-token diffs);
//! - `dump=<dir>`: also write each traced tensor's values as raw little-endian f32 to
//!   `<dir>/<name>-<layer>.<k>.f32` (k: the call's number for that name and layer).
//!
//! e.g. `QUARREL_TRACE=all,row=576` or `QUARREL_TRACE=attn_norm,ffn_out,dump=/tmp/t`.

use std::sync::OnceLock;

/// The parsed `QUARREL_TRACE`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Config {
    /// Names to trace (`["all"]`: every name).
    names: Vec<String>,
    row_width: Option<usize>,
    dump_dir: Option<String>,
}

impl Config {
    fn parse(v: &str) -> Config {
        let mut c = Config::default();
        for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if let Some(w) = item.strip_prefix("row=") {
                c.row_width = w.parse().ok().filter(|&w| w > 0);
            } else if let Some(d) = item.strip_prefix("dump=") {
                c.dump_dir = Some(d.to_string());
            } else {
                c.names.push(item.to_string());
            }
        }
        c
    }

    fn wants(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == "all" || n == name)
    }
}

fn config() -> Option<&'static Config> {
    static C: OnceLock<Option<Config>> = OnceLock::new();
    C.get_or_init(|| std::env::var("QUARREL_TRACE").ok().map(|v| Config::parse(&v))).as_ref()
}

pub fn enabled() -> bool {
    config().is_some()
}

/// Print name, layer, length, sum, sum of squares and the first values to stderr; with
/// `row=<width>` also each row's sum and sum of squares, with `dump=<dir>` the values.
pub fn trace(name: &str, layer: usize, values: &[f32]) {
    let Some(c) = config().filter(|c| c.wants(name)) else { return };
    let sum: f64 = values.iter().map(|&v| v as f64).sum();
    let sq: f64 = values.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let head: Vec<String> = values.iter().take(4).map(|v| format!("{v:.6}")).collect();
    eprintln!("trace {name:>14} L{layer:<3} n={:<8} sum={sum:.6e} sq={sq:.6e} [{}]", values.len(), head.join(", "));
    if let Some(dir) = c.dump_dir.as_deref() {
        // raw little-endian f32 values, one file per call: `<name>-<layer>.<k>.f32`, k counting
        // the calls of that (name, layer) (decode steps, or layers that share a label)
        static SEEN: std::sync::Mutex<Vec<(String, usize)>> = std::sync::Mutex::new(Vec::new());
        let key = format!("{name}-{layer}");
        let k = SEEN.lock().map_or(0, |mut seen| match seen.iter_mut().find(|(n, _)| *n == key) {
            Some((_, c)) => {
                *c += 1;
                *c
            }
            None => {
                seen.push((key.clone(), 0));
                0
            }
        });
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let _ = std::fs::write(std::path::Path::new(dir).join(format!("{key}.{k}.f32")), bytes);
    }
    if let Some(w) = c.row_width.filter(|w| values.len().is_multiple_of(*w)) {
        for (r, row) in values.chunks(w).enumerate() {
            let s: f64 = row.iter().map(|&v| v as f64).sum();
            let q: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
            eprintln!("row {name}-{layer} {r} {s:.9e} {q:.9e} {:.9} {:.9}", row[0], row.get(1).copied().unwrap_or(0.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Config;

    #[test]
    fn names_and_options_parse() {
        let c = Config::parse("attn_norm, ffn_out,row=576,dump=/tmp/t");
        assert_eq!(c.names, ["attn_norm", "ffn_out"]);
        assert_eq!((c.row_width, c.dump_dir.as_deref()), (Some(576), Some("/tmp/t")));
        assert!(c.wants("ffn_out") && !c.wants("attn_out"));
        let all = Config::parse("all");
        assert!(all.wants("anything") && all.row_width.is_none() && all.dump_dir.is_none());
        assert_eq!(Config::parse("all,row=0").row_width, None);
    }
}
