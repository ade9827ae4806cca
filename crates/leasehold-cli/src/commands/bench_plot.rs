//! `bench --plot FILE.svg`: the runs of one `bench` as pictures. Left, the distribution of the
//! waits for the hot key (one line per contender count, the fraction of waits at most so long,
//! on a logarithmic time axis); right, the rate against the number of tasks: cycles per second
//! on keys of their own, handoffs per second on one key.

use crate::exit::Failure;
use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;
use std::path::Path;
use std::time::Duration;

/// One measured run, as the plot needs it.
pub(crate) struct Run<'a> {
    /// Concurrent tasks.
    pub(crate) tasks: usize,
    /// All tasks on one key (the latencies are waits).
    pub(crate) hot: bool,
    /// Cycles or handoffs per second.
    pub(crate) rate: f64,
    /// Sorted latencies.
    pub(crate) latencies: &'a [Duration],
}

/// The lines' colours, in turn: dark enough to tell apart on white.
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn color(i: usize) -> ShapeStyle {
    COLORS[i % COLORS.len()].stroke_width(2)
}

/// The most points of one distribution's line.
const CDF_POINTS: usize = 400;

/// Draws `runs` of the store `described` into the SVG file `path`.
pub(crate) fn draw(path: &Path, described: &str, runs: &[Run<'_>]) -> Result<(), Failure> {
    let failed = |e: String| Failure::error(format!("cannot draw {}: {e}", path.display()));
    let root = SVGBackend::new(path, (1100, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(e.to_string()))?;
    let root = root
        .titled(described, ("sans-serif", 20))
        .map_err(|e| failed(e.to_string()))?;
    let (left, right) = root.split_horizontally(550);
    waits(&left, runs).map_err(|e| failed(e.to_string()))?;
    rates(&right, runs).map_err(|e| failed(e.to_string()))?;
    root.present().map_err(|e| failed(e.to_string()))?;
    Ok(())
}

type Area<'a, 'b> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type Drawn<'a> = Result<(), DrawingAreaErrorKind<<SVGBackend<'a> as DrawingBackend>::ErrorType>>;

/// Milliseconds, at least a microsecond (the axis is logarithmic).
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e3).max(1e-3)
}

fn waits<'a>(area: &Area<'a, '_>, runs: &[Run<'_>]) -> Drawn<'a> {
    let hot: Vec<&Run<'_>> = runs
        .iter()
        .filter(|r| r.hot && !r.latencies.is_empty())
        .collect();
    let lo = hot
        .iter()
        .map(|r| ms(r.latencies[0]))
        .fold(f64::MAX, f64::min);
    let hi = hot
        .iter()
        .map(|r| ms(r.latencies[r.latencies.len() - 1]))
        .fold(0.0, f64::max);
    let (lo, hi) = if hot.is_empty() {
        (0.01, 10.0)
    } else {
        (lo * 0.8, hi * 1.25)
    };
    let mut chart = ChartBuilder::on(area)
        .caption("Waits for one key (handoffs)", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(52)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("wait (ms, logarithmic)")
        .y_desc("fraction of waits at most so long")
        .y_labels(6)
        .max_light_lines(1)
        .x_label_formatter(&|x| short(*x))
        .draw()?;
    for (i, run) in hot.iter().enumerate() {
        let color = color(i);
        let n = run.latencies.len();
        let step = (n / CDF_POINTS).max(1);
        let points = (0..n)
            .step_by(step)
            .chain(std::iter::once(n - 1))
            .map(|j| (ms(run.latencies[j]), (j + 1) as f64 / n as f64));
        chart
            .draw_series(LineSeries::new(points, color))?
            .label(match run.tasks {
                1 => "1 task".to_owned(),
                n => format!("{n} tasks"),
            })
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    if !hot.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()?;
    }
    Ok(())
}

fn rates<'a>(area: &Area<'a, '_>, runs: &[Run<'_>]) -> Drawn<'a> {
    let most_tasks = runs.iter().map(|r| r.tasks).max().unwrap_or(1) as f64;
    let top = runs.iter().map(|r| r.rate).fold(0.0, f64::max).max(1.0) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption("Rate against tasks", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d((0.8..most_tasks * 1.25).log_scale(), 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("concurrent tasks (logarithmic)")
        .y_desc("per second")
        .max_light_lines(1)
        .x_label_formatter(&|x| short(*x))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for (i, (hot, label)) in [
        (false, "cycles/s, keys of their own"),
        (true, "handoffs/s, one key"),
    ]
    .into_iter()
    .enumerate()
    {
        let points: Vec<(f64, f64)> = runs
            .iter()
            .filter(|r| r.hot == hot)
            .map(|r| (r.tasks as f64, r.rate))
            .collect();
        if points.is_empty() {
            continue;
        }
        let color = color(i + 3);
        chart
            .draw_series(LineSeries::new(points.clone(), color).point_size(4))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()?;
    Ok(())
}

/// An axis label: whole numbers without decimals, small ones with as few as they need.
fn short(x: f64) -> String {
    if x >= 10.0 || (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}")
    } else if x >= 0.1 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}
