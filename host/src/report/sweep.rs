//! A sweep's pictures and page: the Pareto front of samples/s against IPUs used
//! (`pareto.svg`) and `index.html` with the best configurations and every row.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::format::{bytes, count, decimal};
use super::html::CSS;
use super::svg::{axis_ticks, px, text_width, tick_label, Font, Key, Stroke, Svg};
use super::svg::{GRID, INK, LIMIT, MUTED};
use crate::sweep::{best, pareto_front, Row};

/// The sweep's picture.
pub const PARETO_FILE: &str = "pareto.svg";

const FITS: &str = "#1f77b4";
const NO_FIT: &str = "#b0b0b0";
const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 560.0;

/// A circle of radius `r` at (`x`, `y`) as path data.
fn circle(x: f64, y: f64, r: f64) -> String {
    format!(
        "M{} {}a{r} {r} 0 1 0 {} 0a{r} {r} 0 1 0 -{} 0Z",
        px(x - r),
        px(y),
        px(2.0 * r),
        px(2.0 * r)
    )
}

/// What a point's tooltip says.
fn tip(r: &Row) -> String {
    let fit = match r.fits {
        Some(true) => "fits",
        _ => "does not fit",
    };
    format!(
        "#{} {}: {} samples/s on {} IPU(s), {fit}",
        r.index,
        r.config,
        decimal(r.samples_per_second.unwrap_or(0.0)),
        r.ipus.unwrap_or(0)
    )
}

/// Samples/s against IPUs used (a log-2 axis): configurations that fit in blue, those
/// that do not in grey, the Pareto front of those that fit joined in red. Rows without an
/// estimate are left out (the caption counts them).
pub fn pareto_svg(title: &str, rows: &[Row]) -> String {
    let (left, right, top, bottom) = (110.0, 30.0, 70.0, 70.0);
    let (w, h) = (WIDTH - left - right, HEIGHT - top - bottom);
    let points: Vec<&Row> = rows
        .iter()
        .filter(|r| r.ipus.is_some() && r.samples_per_second.is_some())
        .collect();
    let failed = rows.len() - points.len();
    let max_ipus = points
        .iter()
        .filter_map(|r| r.ipus)
        .max()
        .unwrap_or(1)
        .max(1);
    let top_ipus = max_ipus.next_power_of_two().max(2);
    let max_sps = points
        .iter()
        .filter_map(|r| r.samples_per_second)
        .fold(0.0f64, f64::max);
    let (ticks, y_top) = axis_ticks(max_sps, 6, 1.0);
    let x_of = |ipus: usize| left + (ipus.max(1) as f64).log2() / (top_ipus as f64).log2() * w;
    let y_of = |sps: f64| top + h - sps / y_top * h;
    let mut s = Svg::new();
    s.text(left, 28.0, Font::new(16.0).bold(), title);
    let fits = points.iter().filter(|r| r.fits()).count();
    s.text(
        left,
        48.0,
        Font::new(12.0).fill(MUTED),
        &format!(
            "{} configurations: {fits} fit, {} do not, {failed} without an estimate",
            rows.len(),
            points.len() - fits
        ),
    );
    for &t in &ticks {
        let y = y_of(t);
        s.line((left, y), (left + w, y), Stroke::solid(GRID));
        s.text(left - 8.0, y + 4.0, Font::new(12.0).end(), &tick_label(t));
    }
    let mut n = 1;
    while n <= top_ipus {
        let x = x_of(n);
        s.line((x, top), (x, top + h), Stroke::solid(GRID));
        s.text(x, top + h + 18.0, Font::new(12.0).middle(), &n.to_string());
        n *= 2;
    }
    s.line((left, top + h), (left + w, top + h), Stroke::solid(INK));
    s.line((left, top), (left, top + h), Stroke::solid(INK));
    s.text(
        left + w / 2.0,
        top + h + 42.0,
        Font::new(13.0).middle(),
        "IPUs used (replicas x IPUs per replica)",
    );
    s.vertical_text(20.0, top + h / 2.0, Font::new(13.0), "samples/s");
    for r in points.iter().filter(|r| !r.fits()) {
        let (x, y) = (
            x_of(r.ipus.unwrap_or(1)),
            y_of(r.samples_per_second.unwrap_or(0.0)),
        );
        s.rect((x - 3.0, y - 3.0), (6.0, 6.0), NO_FIT, Some(&tip(r)));
    }
    for r in points.iter().filter(|r| r.fits()) {
        let (x, y) = (
            x_of(r.ipus.unwrap_or(1)),
            y_of(r.samples_per_second.unwrap_or(0.0)),
        );
        s.path(&circle(x, y, 3.5), FITS, false, Some(&tip(r)));
    }
    let front = pareto_front(rows);
    for pair in front.windows(2) {
        let a = (
            x_of(pair[0].ipus.unwrap_or(1)),
            y_of(pair[0].samples_per_second.unwrap_or(0.0)),
        );
        let b = (
            x_of(pair[1].ipus.unwrap_or(1)),
            y_of(pair[1].samples_per_second.unwrap_or(0.0)),
        );
        s.line(a, b, Stroke::solid(LIMIT).width(2.0));
    }
    for r in &front {
        let (x, y) = (
            x_of(r.ipus.unwrap_or(1)),
            y_of(r.samples_per_second.unwrap_or(0.0)),
        );
        s.path(&circle(x, y, 5.5), LIMIT, false, Some(&tip(r)));
        let label = format!("#{}", r.index);
        let lx = (x + 8.0).min(left + w - text_width(&label, 11.0));
        s.text(lx, y - 8.0, Font::new(11.0).fill(LIMIT), &label);
    }
    s.legend(
        (left + w - 420.0, 40.0),
        420.0,
        &[
            Key {
                colour: FITS,
                label: "fits",
                dashed: false,
            },
            Key {
                colour: NO_FIT,
                label: "does not fit",
                dashed: false,
            },
            Key {
                colour: LIMIT,
                label: "Pareto front (fits)",
                dashed: false,
            },
        ],
    );
    s.finish(WIDTH, HEIGHT)
}

fn rows_table(rows: &[&Row]) -> Markup {
    html! {
        table {
            tr {
                th { "#" } th.k { "configuration" } th { "fits" } th { "IPUs" }
                th { "samples/s" } th { "cycles/step" } th { "fullest tile" } th.k { "command / error" }
            }
            @for r in rows {
                tr {
                    td { (r.index) }
                    td.k { (r.config.to_string()) }
                    td {
                        @match r.fits {
                            Some(true) => span.fits { "yes" },
                            Some(false) => span.oom { "no" },
                            None => "-",
                        }
                    }
                    td { (r.ipus.map(|n| n.to_string()).unwrap_or_default()) }
                    td { (r.samples_per_second.map(decimal).unwrap_or_default()) }
                    td { (r.cycles_per_step.map(count).unwrap_or_default()) }
                    td {
                        @if let Some(t) = &r.fullest_tile {
                            (bytes(t.bytes)) " (IPU " (t.ipu) ", tile " (t.tile) ")"
                        }
                    }
                    td.k {
                        @match &r.error {
                            Some(e) => span.oom { (e) },
                            None => code { (r.command) },
                        }
                    }
                }
            }
        }
    }
}

/// The sweep's page: counts, the best configuration, the picture, the front, every row
/// (those that fit first, by samples/s).
pub fn sweep_page(title: &str, spec: &str, rows: &[Row], missing: usize) -> String {
    let fits = rows.iter().filter(|r| r.fits()).count();
    let failed = rows.iter().filter(|r| r.error.is_some()).count();
    let front = pareto_front(rows);
    let mut all: Vec<&Row> = rows.iter().collect();
    all.sort_by(|a, b| {
        b.fits()
            .cmp(&a.fits())
            .then(
                b.samples_per_second
                    .unwrap_or(-1.0)
                    .total_cmp(&a.samples_per_second.unwrap_or(-1.0)),
            )
            .then(a.index.cmp(&b.index))
    });
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                h1 { (title) }
                p {
                    "Spec: " code { (spec) } ". "
                    (rows.len()) " configurations: " (fits) " fit, "
                    (rows.len() - fits - failed) " do not, " (failed) " without an estimate"
                    @if missing > 0 { ", " b { (missing) " not yet run" } }
                    "."
                }
                h2 { "Best" }
                @match best(rows) {
                    Some(b) => p {
                        "#" (b.index) " " (b.config.to_string()) ": "
                        b { (decimal(b.samples_per_second.unwrap_or(0.0))) " samples/s" }
                        " on " (b.ipus.unwrap_or(0)) " IPU(s). " code { (b.command) }
                    },
                    None => p { "No configuration fits." },
                }
                h2 { "Samples/s against IPUs" }
                img src=(PARETO_FILE) alt="samples/s against IPUs used";
                h2 { "Pareto front (fewest IPUs for the samples/s)" }
                (rows_table(&front))
                h2 { "Every configuration" }
                (rows_table(&all))
            }
        }
    };
    let mut page = page.into_string();
    page.push('\n');
    page
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::sweep::{Config, FullestTile};

    fn row(index: usize, fits: bool, ipus: usize, sps: f64) -> Row {
        let mut c = BTreeMap::new();
        c.insert("model".to_string(), serde_json::Value::from("m<1>"));
        let config = Config(c);
        Row {
            index,
            command: config.command(),
            config,
            fits: Some(fits),
            ipus: Some(ipus),
            cycles_per_step: Some(1234),
            samples_per_second: Some(sps),
            memory_per_ipu: vec![1],
            fullest_tile: Some(FullestTile {
                ipu: 0,
                tile: 3,
                bytes: 4096,
            }),
            boundaries: None,
            out_of_memory: None,
            error: None,
        }
    }

    #[test]
    fn picture_and_page_show_every_point_and_the_front() {
        let mut rows = vec![
            row(0, true, 1, 100.0),
            row(1, false, 4, 900.0),
            row(2, true, 16, 700.0),
        ];
        rows.push(Row::failed(3, &rows[0].config.clone(), "bad <node>"));
        let svg = pareto_svg("t", &rows);
        assert_eq!(
            svg.matches("<title>").count(),
            3 + 2,
            "3 points, 2 on the front"
        );
        assert!(svg.contains("4 configurations: 2 fit, 1 do not, 1 without an estimate"));
        assert!(svg.contains("m&lt;1&gt;"));
        assert_eq!(pareto_svg("t", &rows), svg, "deterministic");
        let page = sweep_page("t", "s.toml", &rows, 2);
        assert!(page.contains("bad &lt;node&gt;"));
        assert!(page.contains("<b>700.0 samples/s</b>") || page.contains("samples/s</b>"));
        assert!(page.contains("2 not yet run"));
        // Nothing but a picture of no points.
        let empty = pareto_svg("t", &[]);
        assert!(empty.contains("0 configurations"));
    }
}
