//! The SVG plot of a [`Sweep`] (`quarrel loadtest --sweep ... --plot FILE.svg`): two panels
//! over the client count (log scale, a tick at each point): generated tokens/s above; time to
//! first token and inter-token latency, p50 / p95 / p99 in milliseconds (log scale), below.
//! Text is left to the viewer's fonts (SVG text elements), so no font is read or embedded.

use crate::{LoadError, Report, Sweep};
use plotters::prelude::*;
use std::path::Path;

const SIZE: (u32, u32) = (960, 900);
const FONT: &str = "sans-serif";

type Metric = fn(&Report) -> f64;

/// The latency series: name, value, colour, dashed.
const LATENCY: [(&str, Metric, RGBColor, bool); 6] = [
    ("TTFT p50", |r| r.ttft.p50_ms, RGBColor(31, 119, 180), false),
    ("TTFT p95", |r| r.ttft.p95_ms, RGBColor(44, 160, 44), false),
    ("TTFT p99", |r| r.ttft.p99_ms, RGBColor(148, 103, 189), false),
    ("ITL p50", |r| r.itl.p50_ms, RGBColor(255, 127, 14), true),
    ("ITL p95", |r| r.itl.p95_ms, RGBColor(214, 39, 40), true),
    ("ITL p99", |r| r.itl.p99_ms, RGBColor(140, 86, 75), true),
];

/// The plot as an SVG document.
pub fn svg(sweep: &Sweep) -> Result<String, LoadError> {
    let mut out = String::new();
    draw(sweep, &mut out).map_err(|e| LoadError::Plot(e.to_string()))?;
    Ok(out)
}

/// Write the plot to `path`.
pub fn write_svg(sweep: &Sweep, path: &Path) -> Result<(), LoadError> {
    let text = svg(sweep)?;
    std::fs::write(path, text).map_err(|e| LoadError::Plot(format!("writing {}: {e}", path.display())))
}

/// Milliseconds as axis labels: 1-2-5 steps, so whole numbers from 1 up and at most three
/// decimals below.
fn ms_label(v: &f64) -> String {
    if *v >= 1.0 {
        return format!("{v:.0}");
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// 1, 2, 5, 10, 20, ...: the latency axis's ticks. plotters' own log-scale ticks crowd a range
/// of less than a few decades (every tenth of a decade labelled) and leave its low end bare.
fn steps(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = vec![];
    let mut decade = 10f64.powi(lo.log10().floor() as i32);
    while decade <= hi {
        out.extend([1.0, 2.0, 5.0].map(|m| m * decade).into_iter().filter(|v| (lo..=hi).contains(v)));
        decade *= 10.0;
    }
    out
}

/// The largest 1-2-5 step at or below `v` (positive).
fn step_below(v: f64) -> f64 {
    let decade = 10f64.powi(v.log10().floor() as i32);
    [5.0, 2.0, 1.0].map(|m| m * decade).into_iter().find(|&s| s <= v).unwrap_or(decade)
}

/// The smallest 1-2-5 step at or above `v` (positive).
fn step_above(v: f64) -> f64 {
    let decade = 10f64.powi(v.log10().floor() as i32);
    [1.0, 2.0, 5.0, 10.0].map(|m| m * decade).into_iter().find(|&s| s >= v).unwrap_or(10.0 * decade)
}

fn draw(sweep: &Sweep, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let mut points: Vec<&Report> = sweep.points.iter().collect();
    points.sort_by_key(|r| r.clients);
    let xs: Vec<f64> = points.iter().map(|r| r.clients as f64).collect();
    let (Some(&lo), Some(&hi)) = (xs.first(), xs.last()) else { return Err("a sweep without points".into()) };
    // room around the first and last points, which would otherwise sit on the frame
    let x_range = || (lo / 1.3..hi * 1.3).log_scale().with_key_points(xs.clone());

    let root = SVGBackend::with_string(out, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let protocol = format!("{:?}", sweep.protocol).to_lowercase();
    let root = root.titled(&format!("quarrel loadtest: {} ({protocol})", sweep.url), (FONT, 22))?;
    let panels = root.split_evenly((2, 1));

    let tps: Vec<(f64, f64)> = points.iter().map(|r| (r.clients as f64, r.generated_tokens_per_s)).collect();
    let top = tps.iter().map(|p| p.1).fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(&panels[0])
        .caption("generated tokens/s", (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range(), 0.0..if top > 0.0 { top * 1.15 } else { 1.0 })?;
    chart
        .configure_mesh()
        .x_desc("clients")
        .y_desc("tokens/s")
        .light_line_style(TRANSPARENT)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    // one series, named by the caption: no legend
    let blue = RGBColor(31, 119, 180);
    chart.draw_series(LineSeries::new(tps.clone(), blue.stroke_width(2)))?;
    chart.draw_series(tps.iter().map(|&p| Circle::new(p, 4, blue.filled())))?;

    // a point without a measurement (no token streamed) has no place on a log scale
    let series: Vec<Vec<(f64, f64)>> =
        LATENCY.iter().map(|(_, f, _, _)| points.iter().map(|r| (r.clients as f64, f(r))).filter(|p| p.1 > 0.0).collect()).collect();
    let values = series.iter().flatten().map(|p| p.1);
    let (min, max) = values.fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    let (y_lo, y_hi) = if max > 0.0 { (step_below(min / 1.2), step_above(max * 1.2)) } else { (1.0, 1000.0) };
    let mut chart = ChartBuilder::on(&panels[1])
        .caption("time to first token (solid) and inter-token latency (dashed), ms", (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range(), (y_lo..y_hi).log_scale().with_key_points(steps(y_lo, y_hi)))?;
    chart.configure_mesh().x_desc("clients").y_desc("ms").x_label_formatter(&|x| format!("{x:.0}")).y_label_formatter(&ms_label).draw()?;
    for ((name, _, color, dashed), data) in LATENCY.iter().zip(series) {
        let (color, style) = (*color, color.stroke_width(2));
        let drawn = if *dashed {
            chart.draw_series(DashedLineSeries::new(data.clone(), 8, 5, style))?
        } else {
            chart.draw_series(LineSeries::new(data.clone(), style))?
        };
        drawn.label(*name).legend(move |(x, y)| {
            let gap = if *dashed { 6 } else { 0 };
            EmptyElement::at((x, y)) + PathElement::new(vec![(0, 0), (7, 0)], style) + PathElement::new(vec![(7 + gap, 0), (20, 0)], style)
        });
        chart.draw_series(data.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).border_style(BLACK).background_style(WHITE).draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_ticks_are_1_2_5_steps_covering_the_values() {
        assert_eq!((step_below(3.4), step_above(170.0)), (2.0, 200.0));
        assert_eq!((step_below(0.05), step_above(0.05)), (0.05, 0.05));
        assert_eq!((step_below(9.9), step_above(10.1)), (5.0, 20.0));
        assert_eq!(steps(2.0, 200.0), [2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0]);
        assert_eq!(steps(0.5, 1.0), [0.5, 1.0]);
        assert_eq!([0.02, 0.5, 2.0, 500.0].map(|v| ms_label(&v)), ["0.02", "0.5", "2", "500"]);
    }
}
