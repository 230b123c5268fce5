//! `memory.svg`: per IPU, every tile's memory at its peak stacked by category, against the
//! tile's SRAM.

use std::fmt::Write as _;

use tessera_sim::memory::{MemoryCategory, TileMemory};
use tessera_sim::system::IpuRow;

use super::format::{bytes, count, percent};
use super::svg::{
    axis_ticks, px, text_width, tick_label, Font, Key, Stroke, Svg, GRID, INK, LIMIT, MUTED, WIDTH,
};
use super::Report;

const LEFT: f64 = 78.0;
const RIGHT: f64 = 24.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
/// Height of one IPU's panel, and of its plot.
const PANEL: f64 = 330.0;
const PLOT_H: f64 = 240.0;
const KIB: f64 = 1024.0;

/// A category's colour in the picture.
fn colour(c: MemoryCategory) -> &'static str {
    match c {
        MemoryCategory::AlwaysLive => "#4e79a7",
        MemoryCategory::NotAlwaysLive => "#59a14f",
        MemoryCategory::Stash => "#b07aa1",
        MemoryCategory::VertexCode => "#f28e2b",
        MemoryCategory::VertexState => "#edc948",
        MemoryCategory::ExchangeCode => "#76b7b2",
        MemoryCategory::ExchangeBuffers => "#9c755f",
        MemoryCategory::ControlCode => "#bab0ac",
        MemoryCategory::Stack => "#ff9da7",
        MemoryCategory::Gaps => "#e6e6e6",
    }
}

/// Per IPU, every tile's memory stacked by category, with the SRAM limit.
pub fn memory_svg(report: &Report) -> String {
    memory_svg_grouped(report, 1)
}

/// Per IPU, one bar for every `tiles_per_bar` neighbouring tiles, drawn as the group's fullest
/// tile (so the peak and the fullest tile stay exact): a compact picture, a notebook's. With 1
/// it is [`memory_svg`].
pub fn memory_svg_grouped(report: &Report, tiles_per_bar: usize) -> String {
    let tiles_per_bar = tiles_per_bar.max(1);
    let e = &report.estimate;
    let sram = report.machine.sram_bytes_per_tile;
    let mut svg = Svg::new();
    let title = format!("Memory per tile: {}", report.title);
    svg.text(20.0, 30.0, Font::new(18.0).bold(), &title);
    let bars = if tiles_per_bar == 1 {
        "each tile's memory at its peak".to_string()
    } else {
        format!("each bar the fullest of {tiles_per_bar} neighbouring tiles at its peak")
    };
    let sub = format!(
        "{} ({} tiles, {} SRAM per tile); {bars}, stacked by category",
        report.machine_name,
        count(u64::from(report.machine.tiles)),
        bytes(sram)
    );
    svg.text(20.0, 50.0, Font::new(12.0).fill(MUTED), &sub);
    let mut keys: Vec<Key> = MemoryCategory::ALL
        .into_iter()
        .map(|c| Key {
            colour: colour(c),
            label: c.label(),
            dashed: false,
        })
        .collect();
    keys.push(Key {
        colour: LIMIT,
        label: "SRAM limit",
        dashed: true,
    });
    let mut top = 62.0 + svg.legend((20.0, 62.0), WIDTH - 40.0, &keys) + 8.0;
    if e.ipus.is_empty() {
        let font = Font::new(14.0).middle().fill(MUTED);
        svg.text(WIDTH / 2.0, top + 40.0, font, "no IPUs in this estimate");
        top += 70.0;
    }
    for row in &e.ipus {
        Panel::new(top, row, sram, tiles_per_bar).draw(&mut svg);
        top += PANEL;
    }
    svg.finish(WIDTH, top + 6.0)
}

/// One IPU's panel: heading, stacked bars, the fullest tile marked, the SRAM limit, axes.
struct Panel<'a> {
    top: f64,
    row: &'a IpuRow,
    sram: u64,
    /// The fullest tile (lowest index on ties) and its bytes.
    fullest: Option<(usize, &'a TileMemory)>,
    /// Neighbouring tiles per bar.
    tiles_per_bar: usize,
    /// The bars: each a run of neighbouring tiles (first, end) and the index of its fullest
    /// tile, whose memory it draws.
    bars: Vec<(usize, usize, usize)>,
    max: u64,
    /// Whether the SRAM limit is on the scale (unless the data is far below it).
    limit_on_scale: bool,
    /// The y axis's ticks and top, in KiB.
    ticks: Vec<f64>,
    axis_top: f64,
}

impl<'a> Panel<'a> {
    fn new(top: f64, row: &'a IpuRow, sram: u64, tiles_per_bar: usize) -> Panel<'a> {
        let fullest_of = |tiles: std::ops::Range<usize>| {
            tiles
                .map(|i| (i, &row.tiles[i]))
                .max_by(|(i, a), (j, b)| a.total().cmp(&b.total()).then(j.cmp(i)))
        };
        let fullest = fullest_of(0..row.tiles.len());
        let bars = (0..row.tiles.len())
            .step_by(tiles_per_bar)
            .map(|first| {
                let end = (first + tiles_per_bar).min(row.tiles.len());
                let (i, _) = fullest_of(first..end).expect("a bar has a tile");
                (first, end, i)
            })
            .collect();
        let max = fullest.map_or(0, |(_, t)| t.total());
        let limit_on_scale = sram > 0 && (max == 0 || max.saturating_mul(4) >= sram);
        let data_top = if limit_on_scale {
            sram.max(max) as f64 / KIB * 1.06
        } else {
            max as f64 / KIB * 1.08
        };
        let (ticks, axis_top) = axis_ticks(data_top, 6, 0.0);
        Panel {
            top,
            row,
            sram,
            fullest,
            tiles_per_bar,
            bars,
            max,
            limit_on_scale,
            ticks,
            axis_top,
        }
    }

    fn plot_top(&self) -> f64 {
        self.top + 44.0
    }

    fn plot_bottom(&self) -> f64 {
        self.plot_top() + PLOT_H
    }

    fn y_of(&self, bytes: u64) -> f64 {
        self.plot_bottom() - (bytes as f64 / KIB) / self.axis_top * PLOT_H
    }

    /// Width of one tile's bar (the plot's width when there are no tiles).
    fn per_tile(&self) -> f64 {
        PLOT_W / self.row.tiles.len().max(1) as f64
    }

    fn draw(&self, svg: &mut Svg) {
        self.heading(svg);
        self.y_axis(svg);
        if self.row.tiles.is_empty() {
            let mid = (self.plot_top() + self.plot_bottom()) / 2.0;
            let font = Font::new(14.0).middle().fill(MUTED);
            svg.text(
                LEFT + PLOT_W / 2.0,
                mid,
                font,
                "no tile memory in this estimate",
            );
        } else {
            self.bars(svg);
            self.fullest_marker(svg);
        }
        self.sram_limit(svg);
        self.x_axis(svg);
    }

    /// The IPU's totals on the left, its stages and tiles in use on the right.
    fn heading(&self, svg: &mut Svg) {
        let (row, ipu) = (self.row, self.row.ipu);
        // The IPU tables' figure (data, code and buffers: the sum of the tiles' data bytes);
        // the gaps the bars also draw are named beside it.
        let used = row.bytes_used;
        let gaps: u64 = row.tiles.iter().map(|t| t.gaps).sum();
        let gaps = if gaps > 0 {
            format!(" (+ {} {})", bytes(gaps), MemoryCategory::Gaps.label())
        } else {
            String::new()
        };
        let heading = match self.fullest {
            Some((i, t)) => format!(
                "IPU {ipu}: {} used{gaps}, fullest tile {} {} of {}",
                bytes(used),
                tile_id(i, t),
                bytes(self.max),
                bytes(self.sram)
            ),
            None => format!("IPU {ipu}: no tiles"),
        };
        let over = row.tiles.iter().filter(|t| t.total() > self.sram).count();
        let note = format!(
            "  ({} tile{} over the limit)",
            count(over as u64),
            if over == 1 { "" } else { "s" }
        );
        let tail = (over > 0).then_some((LIMIT, note.as_str()));
        svg.spans(
            20.0,
            self.top + 20.0,
            Font::new(15.0).bold(),
            &heading,
            tail,
        );
        let stages: Vec<String> = row.stages.iter().map(usize::to_string).collect();
        let right = format!(
            "stage{} {}; {} of {} tiles hold tensors or vertices",
            if stages.len() == 1 { "" } else { "s" },
            if stages.is_empty() {
                "none".to_string()
            } else {
                stages.join(", ")
            },
            count(row.tiles.iter().filter(|t| holds_data(t)).count() as u64),
            count(row.tiles.len() as u64)
        );
        let font = Font::new(12.0).end().fill(MUTED);
        svg.text(WIDTH - RIGHT, self.top + 20.0, font, &right);
    }

    /// Grid lines and KiB ticks.
    fn y_axis(&self, svg: &mut Svg) {
        for &t in &self.ticks {
            let y = self.plot_bottom() - t / self.axis_top * PLOT_H;
            if t > 0.0 {
                svg.line((LEFT, y), (LEFT + PLOT_W, y), Stroke::solid(GRID));
            }
            svg.line((LEFT - 5.0, y), (LEFT, y), Stroke::solid(INK));
            svg.text(LEFT - 8.0, y + 4.0, Font::new(11.0).end(), &tick_label(t));
        }
        let mid = (self.plot_top() + self.plot_bottom()) / 2.0;
        svg.vertical_text(22.0, mid, Font::new(12.0), "KiB");
    }

    /// One path per category; runs of neighbouring tiles with the same segment merge.
    fn bars(&self, svg: &mut Svg) {
        // Each bar's category boundaries, bottom to top: 0, then running sums.
        let bounds: Vec<Vec<u64>> = self
            .bars
            .iter()
            .map(|&(_, _, i)| {
                let t = &self.row.tiles[i];
                let sums = t.categories().scan(0, |sum, (_, b)| {
                    *sum += b;
                    Some(*sum)
                });
                std::iter::once(0).chain(sums).collect()
            })
            .collect();
        let x_of = |bar: usize| {
            let tile = self.bars.get(bar).map_or(self.row.tiles.len(), |b| b.0);
            px(LEFT + tile as f64 * self.per_tile())
        };
        for (c, category) in MemoryCategory::ALL.into_iter().enumerate() {
            let segment = |bar: usize| (bounds[bar][c], bounds[bar][c + 1]);
            let mut d = String::new();
            let mut t = 0;
            while t < bounds.len() {
                let (low, high) = segment(t);
                let end = (t + 1..bounds.len())
                    .find(|&u| segment(u) != (low, high))
                    .unwrap_or(bounds.len());
                if high > low {
                    let (y_high, y_low) = (px(self.y_of(high)), px(self.y_of(low)));
                    let (x0, x1) = (x_of(t), x_of(end));
                    let _ = write!(d, "M{x0} {y_high}H{x1}V{y_low}H{x0}Z");
                }
                t = end;
            }
            if !d.is_empty() {
                svg.path(&d, colour(category), true, Some(category.label()));
            }
        }
    }

    /// A marker above the fullest tile's bar, labelled.
    fn fullest_marker(&self, svg: &mut Svg) {
        let Some((i, t)) = self.fullest.filter(|_| self.max > 0) else {
            return;
        };
        // The middle of the bar that draws it.
        let first = i / self.tiles_per_bar * self.tiles_per_bar;
        let end = (first + self.tiles_per_bar).min(self.row.tiles.len());
        let x = LEFT + (first + end) as f64 / 2.0 * self.per_tile();
        let y = self.y_of(self.max) - 3.0;
        let d = format!(
            "M{} {}L{} {}L{} {}Z",
            px(x),
            px(y),
            px(x - 5.0),
            px(y - 8.0),
            px(x + 5.0),
            px(y - 8.0)
        );
        svg.path(&d, INK, false, None);
        let label = format!("fullest: tile {} ({})", tile_id(i, t), bytes(self.max));
        let font = Font::new(11.0);
        if x + 8.0 + text_width(&label, font.size()) < LEFT + PLOT_W {
            svg.text(x + 8.0, y - 1.0, font, &label);
        } else {
            svg.text(x - 8.0, y - 1.0, font.end(), &label);
        }
    }

    /// The SRAM limit as a dashed line, or a note when it is off the scale.
    fn sram_limit(&self, svg: &mut Svg) {
        let font = Font::new(11.0).end().fill(LIMIT).bold();
        let x = LEFT + PLOT_W - 4.0;
        if self.limit_on_scale {
            let y = self.y_of(self.sram);
            let stroke = Stroke::dashed(LIMIT, "6 3").width(1.5);
            svg.line((LEFT, y), (LEFT + PLOT_W, y), stroke);
            let label = format!("SRAM limit {}", bytes(self.sram));
            svg.text(x, y - 5.0, font, &label);
        } else if self.sram > 0 {
            let label = format!(
                "SRAM limit {} is off this scale: the fullest tile uses {} of it",
                bytes(self.sram),
                percent(self.max as f64 / self.sram as f64)
            );
            svg.text(x, self.plot_top() + 12.0, font, &label);
        }
    }

    /// The plot's frame and the tile axis.
    fn x_axis(&self, svg: &mut Svg) {
        let (top, bottom) = (self.plot_top(), self.plot_bottom());
        svg.line((LEFT, top), (LEFT, bottom), Stroke::solid(INK));
        svg.line((LEFT, bottom), (LEFT + PLOT_W, bottom), Stroke::solid(INK));
        let tiles = self.row.tiles.len() as f64;
        if tiles > 0.0 {
            let (ticks, _) = axis_ticks(tiles, 12, 1.0);
            for &t in ticks.iter().filter(|&&t| t < tiles) {
                let x = LEFT + (t + 0.5) * self.per_tile();
                svg.line((x, bottom), (x, bottom + 4.0), Stroke::solid(INK));
                svg.text(x, bottom + 16.0, Font::new(11.0).middle(), &tick_label(t));
            }
        }
        let font = Font::new(12.0).middle();
        svg.text(LEFT + PLOT_W / 2.0, bottom + 33.0, font, "tile");
    }
}

/// Whether a tile holds tensors or vertices (more than code and stack), as the estimate's
/// `tiles_used` counts them.
fn holds_data(t: &TileMemory) -> bool {
    use MemoryCategory::{AlwaysLive, NotAlwaysLive, VertexState};
    [AlwaysLive, NotAlwaysLive, VertexState]
        .into_iter()
        .any(|c| t.get(c) > 0)
}

/// Tiles carry their own id; the index stands in when a file has none.
fn tile_id(index: usize, t: &TileMemory) -> String {
    if t.tile.0 == 0 && index != 0 {
        index.to_string()
    } else {
        t.tile.to_string()
    }
}
