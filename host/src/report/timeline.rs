//! `timeline.svg`: the pipeline's stage runs over one weight update, one row per stage, then
//! the all-reduce and the weight update.

use tessera_sim::system::SystemEstimate;

use super::format::{count, seconds, short_decimal};
use super::svg::{
    axis_ticks, bold_width, tick_label, Font, Key, Stroke, Svg, GRID, INK, MUTED, WHITE, WIDTH,
};
use super::Report;

const FORWARD: &str = "#4e79a7";
const BACKWARD: &str = "#f28e2b";
const UPDATE: &str = "#59a14f";
const ALL_REDUCE: &str = "#9c755f";
const BOUNDARY: &str = "#999999";
const BAND: &str = "#f6f6f6";
const LEFT: f64 = 140.0;
const RIGHT: f64 = 30.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const ROW: f64 = 46.0;
const BAR: f64 = 32.0;

/// The pipeline: one row per stage, each run a block, then the all-reduce and weight update.
pub fn timeline_svg(report: &Report) -> String {
    let e = &report.estimate;
    let mut svg = Svg::new();
    let plot_top = header(&mut svg, report) + 22.0;
    let plot = Plot::new(e, plot_top);
    let height = plot.bottom() + 60.0;
    if plot.total == 0 || plot.rows.is_empty() {
        let font = Font::new(14.0).middle().fill(MUTED);
        let y = plot.top + plot.rows_height() / 2.0 + 5.0;
        svg.text(
            LEFT + PLOT_W / 2.0,
            y,
            font,
            "no stage runs in this estimate",
        );
    } else {
        plot.bands(&mut svg);
        plot.cycle_axis(&mut svg, report.machine.clock_hz);
        plot.step_boundaries(&mut svg, e);
        plot.runs(&mut svg, e);
        plot.updates(&mut svg, e);
    }
    let (top, bottom) = (plot.top, plot.bottom());
    svg.line((LEFT, top), (LEFT, bottom), Stroke::solid(INK));
    svg.line((LEFT, bottom), (LEFT + PLOT_W, bottom), Stroke::solid(INK));
    svg.finish(WIDTH, height)
}

/// Title, subtitle and legend; returns where the legend ends.
fn header(svg: &mut Svg, report: &Report) -> f64 {
    let e = &report.estimate;
    let title = format!(
        "Pipeline timeline: {} schedule, M = {}, {} cycles per weight update ({})",
        e.schedule,
        e.accumulation,
        count(e.cycles_per_weight_update),
        seconds(e.seconds_per_weight_update)
    );
    svg.text(20.0, 30.0, Font::new(18.0).bold(), &title);
    let sub = format!("{} on {}", report.title, report.machine_name);
    svg.text(20.0, 50.0, Font::new(12.0).fill(MUTED), &sub);
    let key = |colour, label, dashed| Key {
        colour,
        label,
        dashed,
    };
    let mut keys = vec![
        key(FORWARD, "forward (F = micro-batch)", false),
        key(BACKWARD, "backward (B = micro-batch)", false),
    ];
    if e.all_reduce_cycles > 0 {
        keys.push(key(ALL_REDUCE, "all-reduce", false));
    }
    if e.weight_update_cycles > 0 {
        keys.push(key(UPDATE, "weight update", false));
    }
    keys.push(key(BOUNDARY, "pipeline step boundary", true));
    62.0 + svg.legend((20.0, 62.0), WIDTH - 40.0, &keys)
}

/// A block of the timeline: the cycles it spans, its colour, its label (shown when it fits)
/// and its tooltip.
struct Block<'a> {
    span: (u64, u64),
    colour: &'a str,
    label: &'a str,
    tip: &'a str,
}

/// Where everything goes: the rows (stage, IPU) and the cycle scale.
struct Plot {
    top: f64,
    rows: Vec<(usize, usize)>,
    /// Cycles to show: the update's, or whatever runs past it.
    total: u64,
    ticks: Vec<f64>,
    axis_top: f64,
    update_start: u64,
}

impl Plot {
    fn new(e: &SystemEstimate, top: f64) -> Plot {
        // Rows: every stage the estimate or its runs know, in order.
        let mut rows: Vec<(usize, usize)> = e.stages.iter().map(|s| (s.stage, s.ipu)).collect();
        for r in &e.runs {
            if !rows.iter().any(|&(k, _)| k == r.stage) {
                rows.push((r.stage, r.ipu));
            }
        }
        rows.sort_unstable();
        rows.dedup_by_key(|r| r.0);
        let update_start = e.pipeline_cycles.saturating_add(e.all_reduce_cycles);
        let run_ends = e.runs.iter().map(|r| r.start.saturating_add(r.cycles));
        let update_ends = e
            .ipus
            .iter()
            .map(|r| update_start.saturating_add(r.weight_update_cycles));
        let total = run_ends
            .chain(update_ends)
            .chain([e.cycles_per_weight_update, e.pipeline_cycles])
            .max()
            .unwrap_or(0);
        let (ticks, axis_top) = axis_ticks(total as f64, 10, 1.0);
        Plot {
            top,
            rows,
            total,
            ticks,
            axis_top,
            update_start,
        }
    }

    fn rows_height(&self) -> f64 {
        ROW * self.rows.len().max(1) as f64
    }

    fn bottom(&self) -> f64 {
        self.top + self.rows_height()
    }

    fn x_of(&self, cycle: u64) -> f64 {
        LEFT + cycle as f64 / self.axis_top * PLOT_W
    }

    /// The top of the bars of row `i`.
    fn bar_y(&self, i: usize) -> f64 {
        self.top + i as f64 * ROW + (ROW - BAR) / 2.0
    }

    /// Alternate row bands and each row's label.
    fn bands(&self, svg: &mut Svg) {
        for (i, &(stage, ipu)) in self.rows.iter().enumerate() {
            let y = self.top + i as f64 * ROW;
            if i % 2 == 1 {
                svg.rect((LEFT, y), (PLOT_W, ROW), BAND, None);
            }
            let label = format!("stage {stage} (IPU {ipu})");
            svg.text(
                LEFT - 10.0,
                y + ROW / 2.0 + 4.5,
                Font::new(13.0).end(),
                &label,
            );
        }
    }

    /// Grid lines, cycle ticks and the axis title.
    fn cycle_axis(&self, svg: &mut Svg, clock_hz: f64) {
        let bottom = self.bottom();
        for &t in &self.ticks {
            let x = LEFT + t / self.axis_top * PLOT_W;
            if t > 0.0 {
                svg.line((x, self.top), (x, bottom), Stroke::solid(GRID));
            }
            svg.line((x, bottom), (x, bottom + 5.0), Stroke::solid(INK));
            svg.text(x, bottom + 18.0, Font::new(11.0).middle(), &tick_label(t));
        }
        let mhz = clock_hz / 1e6;
        let title = if mhz.is_finite() && mhz > 0.0 {
            let mhz = short_decimal(mhz);
            format!("cycles (1 µs = {mhz} cycles at {mhz} MHz)")
        } else {
            "cycles".to_string()
        };
        let font = Font::new(12.0).middle();
        svg.text(LEFT + PLOT_W / 2.0, bottom + 38.0, font, &title);
    }

    /// A dashed line where each step's first run starts and where the pipeline ends, labelled
    /// when no two labels would collide.
    fn step_boundaries(&self, svg: &mut Svg, e: &SystemEstimate) {
        let mut step_starts: Vec<(usize, u64)> = Vec::new();
        for r in &e.runs {
            match step_starts.iter_mut().find(|(s, _)| *s == r.step) {
                Some((_, at)) => *at = (*at).min(r.start),
                None => step_starts.push((r.step, r.start)),
            }
        }
        step_starts.sort_unstable();
        let mut marks: Vec<u64> = step_starts.iter().map(|&(_, at)| at).collect();
        marks.push(e.pipeline_cycles);
        let labelled = marks
            .windows(2)
            .all(|w| self.x_of(w[1]) - self.x_of(w[0]) >= 44.0);
        let font = Font::new(10.0).fill(MUTED);
        let mut boundary = |at: u64, label: Option<&str>| {
            let x = self.x_of(at);
            let stroke = Stroke::dashed(BOUNDARY, "3 3");
            svg.line((x, self.top - 14.0), (x, self.bottom()), stroke);
            if let Some(label) = label {
                svg.text(x + 3.0, self.top - 5.0, font, label);
            }
        };
        for &(step, at) in &step_starts {
            let label = format!("step {step}");
            boundary(at, labelled.then_some(label.as_str()));
        }
        if e.pipeline_cycles > 0 {
            let after = e.weight_update_cycles > 0 || e.all_reduce_cycles > 0;
            let label = if e.all_reduce_cycles > 0 {
                "all-reduce, update"
            } else {
                "update"
            };
            boundary(e.pipeline_cycles, after.then_some(label));
        }
    }

    /// Every stage run, on its stage's row; the steady-state steps counted but not listed,
    /// as one block across the rows.
    fn runs(&self, svg: &mut Svg, e: &SystemEstimate) {
        if let Some(el) = e.elided {
            let tip = format!(
                "steps {} to {}: the steady state, each period as the one before: {} cycles",
                el.first_step,
                el.first_step + el.steps - 1,
                count(el.cycles)
            );
            let label = format!("{} steady steps", count(el.steps as u64));
            let span = (el.start, el.start.saturating_add(el.cycles));
            for i in 0..self.rows.len() {
                let block = Block {
                    span,
                    colour: GRID,
                    label: &label,
                    tip: &tip,
                };
                self.block(svg, i, &block);
            }
        }
        for r in &e.runs {
            let row = self.rows.iter().position(|&(k, _)| k == r.stage);
            let (colour, letter, direction) = if r.backward {
                (BACKWARD, 'B', "backward")
            } else {
                (FORWARD, 'F', "forward")
            };
            let tip = format!(
                "stage {} {direction} micro-batch {}: {} cycles from {} (step {})",
                r.stage,
                r.micro_batch,
                count(r.cycles),
                count(r.start),
                r.step
            );
            let label = format!("{letter}{}", r.micro_batch);
            let span = (r.start, r.start.saturating_add(r.cycles));
            let block = Block {
                span,
                colour,
                label: &label,
                tip: &tip,
            };
            self.block(svg, row.unwrap_or(0), &block);
        }
    }

    /// The all-reduce and each IPU's weight update, on every row of the IPU.
    fn updates(&self, svg: &mut Svg, e: &SystemEstimate) {
        for (i, &(_, ipu)) in self.rows.iter().enumerate() {
            if e.all_reduce_cycles > 0 {
                let tip = format!("all-reduce: {} cycles", count(e.all_reduce_cycles));
                let span = (e.pipeline_cycles, self.update_start);
                let block = Block {
                    span,
                    colour: ALL_REDUCE,
                    label: "all-reduce",
                    tip: &tip,
                };
                self.block(svg, i, &block);
            }
            let cycles = e
                .ipus
                .iter()
                .find(|r| r.ipu == ipu)
                .map_or(0, |r| r.weight_update_cycles);
            if cycles > 0 {
                let tip = format!("IPU {ipu} weight update: {} cycles", count(cycles));
                let span = (self.update_start, self.update_start.saturating_add(cycles));
                let block = Block {
                    span,
                    colour: UPDATE,
                    label: "update",
                    tip: &tip,
                };
                self.block(svg, i, &block);
            }
        }
    }

    /// `block` on row `row` over the cycles it spans, with its tooltip; its label only when
    /// it fits.
    fn block(&self, svg: &mut Svg, row: usize, block: &Block<'_>) {
        let &Block {
            span,
            colour,
            label,
            tip,
        } = block;
        let (x, y) = (self.x_of(span.0), self.bar_y(row));
        let w = self.x_of(span.1) - x;
        if w <= 0.0 {
            return;
        }
        svg.rect((x, y), (w, BAR), colour, Some(tip));
        let fits = [12.0, 10.0]
            .into_iter()
            .find(|&size| bold_width(label, size) + 4.0 <= w);
        if let Some(size) = fits {
            let font = Font::new(size).middle().fill(WHITE).bold();
            svg.text(x + w / 2.0, y + BAR / 2.0 + size * 0.38, font, label);
        }
    }
}
