//! Named intermediates: `trace("attn_norm", layer, &values)` records a tensor summary when
//! `QUARREL_TRACE` is set (to a layer-name filter or `all`), so a golden diff can name the
//! first layer that diverges. A cheap no-op otherwise. `QUARREL_TRACE_DUMP=<dir>` also writes
//! each traced tensor's values as raw little-endian f32 to `<dir>/<name>-<layer>.<k>.f32` (k:
//! the call's number for that name and layer).

use std::sync::OnceLock;

fn filter() -> Option<&'static str> {
    static F: OnceLock<Option<String>> = OnceLock::new();
    F.get_or_init(|| std::env::var("QUARREL_TRACE").ok()).as_deref()
}

pub fn enabled() -> bool {
    filter().is_some()
}

fn row_width() -> Option<usize> {
    static W: OnceLock<Option<usize>> = OnceLock::new();
    *W.get_or_init(|| std::env::var("QUARREL_TRACE_ROW").ok().and_then(|v| v.parse().ok()).filter(|&w| w > 0))
}

fn dump_dir() -> Option<&'static str> {
    static D: OnceLock<Option<String>> = OnceLock::new();
    D.get_or_init(|| std::env::var("QUARREL_TRACE_DUMP").ok()).as_deref()
}

/// Print name, layer, length, sum, sum of squares and the first values to stderr; with
/// `QUARREL_TRACE_ROW=<width>` also each row's sum and sum of squares (per-token diffs).
pub fn trace(name: &str, layer: usize, values: &[f32]) {
    let Some(f) = filter() else { return };
    if f != "all" && !f.split(',').any(|x| x == name) {
        return;
    }
    let sum: f64 = values.iter().map(|&v| v as f64).sum();
    let sq: f64 = values.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let head: Vec<String> = values.iter().take(4).map(|v| format!("{v:.6}")).collect();
    eprintln!("trace {name:>14} L{layer:<3} n={:<8} sum={sum:.6e} sq={sq:.6e} [{}]", values.len(), head.join(", "));
    if let Some(dir) = dump_dir() {
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
    if let Some(w) = row_width().filter(|w| values.len().is_multiple_of(*w)) {
        for (r, row) in values.chunks(w).enumerate() {
            let s: f64 = row.iter().map(|&v| v as f64).sum();
            let q: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
            eprintln!("row {name}-{layer} {r} {s:.9e} {q:.9e} {:.9} {:.9}", row[0], row.get(1).copied().unwrap_or(0.0));
        }
    }
}
