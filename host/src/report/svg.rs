//! What both pictures draw with: an SVG document written as text, its colours and fonts, a
//! legend, and axes ending on a round number.

use std::fmt::Write as _;

use super::format;

/// Every picture's width.
pub(super) const WIDTH: f64 = 1400.0;
pub(super) const INK: &str = "#222222";
pub(super) const MUTED: &str = "#666666";
pub(super) const GRID: &str = "#e6e6e6";
pub(super) const LIMIT: &str = "#d62728";
pub(super) const WHITE: &str = "#ffffff";
const FONT: &str = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif";

/// How a text is set: size, anchor, colour, weight.
#[derive(Clone, Copy, Debug)]
pub(super) struct Font {
    size: f64,
    anchor: &'static str,
    fill: &'static str,
    bold: bool,
}

impl Font {
    /// `size` px, left-aligned, in ink.
    pub const fn new(size: f64) -> Font {
        Font {
            size,
            anchor: "start",
            fill: INK,
            bold: false,
        }
    }
    pub const fn middle(self) -> Font {
        Font {
            anchor: "middle",
            ..self
        }
    }
    pub const fn end(self) -> Font {
        Font {
            anchor: "end",
            ..self
        }
    }
    pub const fn fill(self, fill: &'static str) -> Font {
        Font { fill, ..self }
    }
    pub const fn bold(self) -> Font {
        Font { bold: true, ..self }
    }
    pub fn size(self) -> f64 {
        self.size
    }
}

/// How a line is drawn: colour, width, dashes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stroke {
    colour: &'static str,
    width: Option<f64>,
    dashes: Option<&'static str>,
}

impl Stroke {
    /// A thin solid line.
    pub const fn solid(colour: &'static str) -> Stroke {
        Stroke {
            colour,
            width: None,
            dashes: None,
        }
    }
    /// A dashed line: `dashes` is SVG's `stroke-dasharray`.
    pub const fn dashed(colour: &'static str, dashes: &'static str) -> Stroke {
        Stroke {
            colour,
            width: None,
            dashes: Some(dashes),
        }
    }
    pub const fn width(self, width: f64) -> Stroke {
        Stroke {
            width: Some(width),
            ..self
        }
    }
}

/// One legend entry: a swatch (or a dashed line) and its label.
#[derive(Clone, Copy, Debug)]
pub(super) struct Key<'a> {
    pub colour: &'static str,
    pub label: &'a str,
    pub dashed: bool,
}

/// An SVG document being drawn; [`Svg::finish`] gives its text.
#[derive(Debug, Default)]
pub(super) struct Svg {
    body: String,
}

impl Svg {
    pub fn new() -> Svg {
        Svg::default()
    }

    /// One line of text.
    pub fn text(&mut self, x: f64, y: f64, font: Font, s: &str) {
        self.spans(x, y, font, s, None);
    }

    /// A text followed by a second one in its own colour, spaces kept.
    pub fn spans(&mut self, x: f64, y: f64, font: Font, s: &str, tail: Option<(&str, &str)>) {
        let _ = write!(
            self.body,
            "<text x=\"{}\" y=\"{}\" font-size=\"{}\" text-anchor=\"{}\" fill=\"{}\"",
            px(x),
            px(y),
            px(font.size),
            font.anchor,
            font.fill
        );
        if font.bold {
            self.body.push_str(" font-weight=\"bold\"");
        }
        if tail.is_some() {
            self.body.push_str(" xml:space=\"preserve\"");
        }
        self.body.push('>');
        push_escaped(&mut self.body, s);
        if let Some((fill, tail)) = tail {
            let _ = write!(self.body, "<tspan fill=\"{fill}\">");
            push_escaped(&mut self.body, tail);
            self.body.push_str("</tspan>");
        }
        self.body.push_str("</text>\n");
    }

    /// Text turned a quarter anticlockwise about its anchor, centred on it.
    pub fn vertical_text(&mut self, x: f64, y: f64, font: Font, s: &str) {
        let (x, y) = (px(x), px(y));
        let _ = write!(
            self.body,
            "<text x=\"{x}\" y=\"{y}\" font-size=\"{}\" text-anchor=\"middle\" fill=\"{}\" transform=\"rotate(-90 {x} {y})\">",
            px(font.size),
            font.fill
        );
        push_escaped(&mut self.body, s);
        self.body.push_str("</text>\n");
    }

    pub fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: Stroke) {
        let _ = write!(
            self.body,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"",
            px(x1),
            px(y1),
            px(x2),
            px(y2),
            stroke.colour
        );
        if let Some(w) = stroke.width {
            let _ = write!(self.body, " stroke-width=\"{}\"", px(w));
        }
        if let Some(d) = stroke.dashes {
            let _ = write!(self.body, " stroke-dasharray=\"{d}\"");
        }
        self.body.push_str("/>\n");
    }

    /// A filled rectangle; with a tooltip it gets a thin white outline too.
    pub fn rect(&mut self, (x, y): (f64, f64), (w, h): (f64, f64), fill: &str, tip: Option<&str>) {
        let _ = write!(
            self.body,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"",
            px(x),
            px(y),
            px(w.max(0.0)),
            px(h.max(0.0))
        );
        let outline = format!(" stroke=\"{WHITE}\" stroke-width=\"0.75\"");
        self.close_shape("rect", tip, &outline);
    }

    /// A filled path (`d` in SVG's path syntax); `crisp` for edges on whole pixels (bars), and
    /// an optional tooltip.
    pub fn path(&mut self, d: &str, fill: &str, crisp: bool, tip: Option<&str>) {
        let _ = write!(self.body, "<path d=\"{d}\" fill=\"{fill}\"");
        if crisp {
            self.body.push_str(" shape-rendering=\"crispEdges\"");
        }
        self.close_shape("path", tip, "");
    }

    fn close_shape(&mut self, element: &str, tip: Option<&str>, tipped_attributes: &str) {
        match tip {
            None => self.body.push_str("/>\n"),
            Some(tip) => {
                self.body.push_str(tipped_attributes);
                self.body.push_str("><title>");
                push_escaped(&mut self.body, tip);
                let _ = writeln!(self.body, "</title></{element}>");
            }
        }
    }

    /// Swatches with labels from (`x`, `y`), wrapped to `width`; returns the height used.
    pub fn legend(&mut self, (x0, y0): (f64, f64), width: f64, keys: &[Key<'_>]) -> f64 {
        const ROW: f64 = 20.0;
        let (mut x, mut y) = (x0, y0);
        for key in keys {
            let w = 18.0 + text_width(key.label, 12.0) + 18.0;
            if x > x0 && x + w > x0 + width {
                x = x0;
                y += ROW;
            }
            if key.dashed {
                let stroke = Stroke::dashed(key.colour, "4 2").width(2.0);
                self.line((x, y + 6.0), (x + 13.0, y + 6.0), stroke);
            } else {
                self.rect((x, y), (12.0, 12.0), key.colour, None);
            }
            self.text(x + 18.0, y + 10.5, Font::new(12.0), key.label);
            x += w;
        }
        y + ROW - y0
    }

    /// The document: a `width` x `height` white page with everything drawn on it.
    pub fn finish(self, width: f64, height: f64) -> String {
        let (w, h) = (px(width), px(height));
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"{FONT}\">\n\
             <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"{WHITE}\"/>\n{}</svg>\n",
            self.body
        )
    }
}

/// `s` as XML text: markup escaped (by maud's escaper), and the control characters XML 1.0
/// forbids even as references replaced by U+FFFD.
fn push_escaped(out: &mut String, s: &str) {
    let clean: String = s
        .chars()
        .map(|c| {
            if c.is_control() && !matches!(c, '\t' | '\n' | '\r') {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect();
    let _ = maud::Escaper::new(out).write_str(&clean);
}

/// A pixel coordinate: at most two decimals, no trailing zeros.
pub(super) fn px(v: f64) -> String {
    if !v.is_finite() {
        return "0".into();
    }
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" || s.is_empty() {
        "0".into()
    } else {
        s.to_string()
    }
}

/// Rough width of `text` at `size` px in a sans-serif font (for layout only).
pub(super) fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.58
}

/// [`text_width`] for bold text.
pub(super) fn bold_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.7
}

/// A step of 1, 2 or 5 times a power of ten near `raw` (at least `raw`); 1 for nonsense.
fn nice_step(raw: f64) -> f64 {
    if !raw.is_finite() || raw <= 0.0 {
        return 1.0;
    }
    let base = 10f64.powf(raw.log10().floor());
    let nice = [1.0, 2.0, 5.0]
        .into_iter()
        .find(|&n| raw / base <= n)
        .unwrap_or(10.0);
    nice * base
}

/// Axis ticks from 0 to at least `max` with about `target` intervals: (ticks, axis top). The
/// top is the last tick, so the axis ends on a label; of the steps 1, 2 or 5 times a power of
/// ten giving between 2/3 and 5/3 of `target` intervals, the one with the lowest top wins (then
/// the one nearest `target`). `min_step` keeps integer axes integral.
pub(super) fn axis_ticks(max: f64, target: usize, min_step: f64) -> (Vec<f64>, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        min_step.max(1.0)
    };
    let target = target.max(1);
    let intervals = |step: f64| (max / step - 1e-9).ceil().max(1.0) as usize;
    let (lo, hi) = ((target * 2).div_ceil(3), target * 5 / 3 + 1);
    let power = 10f64.powf((max / target as f64).log10().floor());
    let mut best: Option<(f64, usize, f64)> = None; // (top, distance from target, step)
    for scale in [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0] {
        let step = power * scale;
        let n = intervals(step);
        if step < min_step || n < lo || n > hi {
            continue;
        }
        let candidate = (n as f64 * step, n.abs_diff(target), step);
        let better = best.is_none_or(|(top, dist, _)| {
            candidate.0 < top - 1e-9 * top
                || (candidate.0 <= top + 1e-9 * top && candidate.1 < dist)
        });
        if better {
            best = Some(candidate);
        }
    }
    let fallback = nice_step(max / target as f64).max(min_step);
    let step = best.map_or(fallback, |(_, _, step)| step);
    let n = intervals(step);
    let ticks: Vec<f64> = (0..=n).map(|i| i as f64 * step).collect();
    (ticks, n as f64 * step)
}

/// A tick label: a grouped integer, or up to two decimals.
pub(super) fn tick_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 && v.abs() < 1e18 {
        let sign = if v.round() < 0.0 { "-" } else { "" };
        format!("{sign}{}", format::count(v.round().abs() as u64))
    } else {
        px(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_xml_safe() {
        let mut s = Svg::new();
        s.text(0.0, 0.0, Font::new(12.0), "a<b & c>\"d'");
        s.text(0.0, 0.0, Font::new(12.0), "bell\u{7}");
        assert!(
            s.body.contains(">a&lt;b &amp; c&gt;&quot;d'</text>"),
            "{}",
            s.body
        );
        assert!(s.body.contains(">bell\u{FFFD}</text>"));
        s.rect((0.0, 0.0), (1.0, 1.0), INK, Some("<tip>"));
        assert!(s.body.contains("<title>&lt;tip&gt;</title></rect>"));
    }

    #[test]
    fn pixel_numbers_are_short_and_stable() {
        assert_eq!(px(1.0), "1");
        assert_eq!(px(1.5), "1.5");
        assert_eq!(px(1.234_567), "1.23");
        assert_eq!(px(-0.001), "0");
        assert_eq!(px(f64::NAN), "0");
    }

    #[test]
    fn nice_axis_ticks() {
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nice_step(13.0), 20.0);
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(100.0), 100.0);
        let (t, top) = axis_ticks(661.4, 6, 0.0);
        assert_eq!(
            t,
            vec![0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0]
        );
        assert_eq!(top, 700.0);
        let (t, top) = axis_ticks(15.0, 6, 0.0);
        assert_eq!(top, 16.0);
        assert_eq!(t.len(), 9);
        let (t, top) = axis_ticks(93_809.0, 10, 1.0);
        assert_eq!(t.first(), Some(&0.0));
        assert_eq!(top, 100_000.0);
        assert_eq!(t.len(), 11);
        // Small integer axes stay integral; nonsense gives one interval.
        let (t, _) = axis_ticks(3.0, 12, 1.0);
        assert_eq!(t, vec![0.0, 1.0, 2.0, 3.0]);
        let (t, top) = axis_ticks(1472.0, 12, 1.0);
        assert_eq!((t[1], top), (100.0, 1500.0));
        let (t, top) = axis_ticks(f64::NAN, 5, 0.0);
        assert_eq!((t.len(), top), (6, 1.0));
        assert_eq!(tick_label(20_000.0), "20,000");
        assert_eq!(tick_label(-3.0), "-3");
        assert_eq!(tick_label(2.5), "2.5");
    }

    #[test]
    fn legend_wraps() {
        let mut s = Svg::new();
        let key = Key {
            colour: INK,
            label: "a long legend entry",
            dashed: false,
        };
        let h = s.legend((0.0, 0.0), 400.0, &[key; 10]);
        assert!(h >= 60.0, "{h}");
    }
}
