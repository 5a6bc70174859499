//! Figures of the paper's analyses, drawn with `plotters` into PNG or SVG (chosen by the output
//! file's extension):
//!
//! - [`AttentionFigure`]: attention heatmap of one translation with its per-step gate values
//!   (paper Fig. 6);
//! - [`CategoryFigure`]: one or more panels of series over categories — BLEU and output length
//!   per source-length group (Fig. 7, [`length_groups_figure`]) and length ratio / BLEU per
//!   context-scaling setting (Fig. 2a, [`context_scaling_figure`]);
//! - [`TrainingFigure`]: training loss per token and dev BLEU against the update step;
//! - [`StepCurvesFigure`]: several systems' curves against the update step in one panel.
//!
//! Text needs no system font: DejaVu Sans (Latin, Greek, Cyrillic, …) and Droid Sans Fallback
//! (CJK) are compiled in from `assets/fonts` and registered with plotters' `ab_glyph` backend;
//! a label whose characters DejaVu Sans lacks is drawn with Droid Sans Fallback. In SVG files
//! text stays text (`font-family` `sans-serif` or `Droid Sans Fallback`), rendered by the
//! viewer's fonts.

use std::io::BufWriter;
use std::path::Path;
use std::sync::{Once, OnceLock};

use ab_glyph::{Font, FontRef, ScaleFont};
use anyhow::{anyhow, bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle, FontTransform};

use crate::analysis::{ContextScaling, DumpRecord, LengthGroups, TrainingLog};

/// Font family of Latin-script text (DejaVu Sans).
pub const SANS: &str = "sans-serif";
/// Font family of CJK text (Droid Sans Fallback).
pub const CJK: &str = "Droid Sans Fallback";

static DEJAVU: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
static DROID: &[u8] = include_bytes!("../assets/fonts/DroidSansFallbackFull.ttf");

static FONTS_OK: OnceLock<bool> = OnceLock::new();

/// Registers the shipped fonts with plotters (idempotent); errors if a font fails to parse.
pub fn register_fonts() -> anyhow::Result<()> {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let ok = register_font(SANS, FontStyle::Normal, DEJAVU).is_ok()
            && register_font(CJK, FontStyle::Normal, DROID).is_ok();
        let _ = FONTS_OK.set(ok);
    });
    if FONTS_OK.get().copied().unwrap_or(false) {
        Ok(())
    } else {
        bail!("the fonts compiled into cgnmt-eval could not be parsed")
    }
}

fn font_ref(family: &str) -> Option<&'static FontRef<'static>> {
    static SANS_REF: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    static CJK_REF: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    if family == CJK {
        CJK_REF
            .get_or_init(|| FontRef::try_from_slice(DROID).ok())
            .as_ref()
    } else {
        SANS_REF
            .get_or_init(|| FontRef::try_from_slice(DEJAVU).ok())
            .as_ref()
    }
}

/// The font family to draw `text` with: [`SANS`] if DejaVu Sans has every character, else
/// [`CJK`].
pub fn family_for(text: &str) -> &'static str {
    match font_ref(SANS) {
        Some(f)
            if text
                .chars()
                .filter(|c| !c.is_whitespace())
                .all(|c| f.glyph_id(c).0 != 0) =>
        {
            SANS
        }
        _ => CJK,
    }
}

/// Width in pixels of `text` at font size `size` as plotters lays it out.
pub fn text_width(text: &str, size: f64) -> f64 {
    let Some(f) = font_ref(family_for(text)) else {
        return text.chars().count() as f64 * size * 0.6;
    };
    let f = f.as_scaled(size as f32);
    let mut w = 0.0f32;
    let mut prev = None;
    for c in text.chars() {
        let g = f.glyph_id(c);
        w += f.h_advance(g);
        if let Some(p) = prev {
            w += f.kern(p, g);
        }
        prev = Some(g);
    }
    w as f64
}

/// Output format, from the file extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.png`
    Png,
    /// `.svg`
    Svg,
}

/// The format of an output path (`.png` or `.svg`, any case).
pub fn format_of(path: &Path) -> anyhow::Result<Format> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .as_deref()
    {
        Some("png") => Ok(Format::Png),
        Some("svg") => Ok(Format::Svg),
        _ => bail!(
            "{}: unknown plot format: the output file must end in .png or .svg",
            path.display()
        ),
    }
}

/// Something that can be drawn onto any plotters backend.
pub trait Figure {
    /// Image size in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws the figure onto `root` (already sized [`Figure::size`]).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>;
}

fn de<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing failed: {e}")
}

/// Renders a figure into an RGB pixel buffer (`width * height * 3` bytes).
pub fn render_rgb<F: Figure>(fig: &F) -> anyhow::Result<(u32, u32, Vec<u8>)> {
    register_fonts()?;
    let (w, h) = fig.size();
    let mut buf = vec![255u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        fig.draw(&root)?;
        root.present().map_err(de)?;
    }
    Ok((w, h, buf))
}

/// Renders a figure as PNG bytes.
pub fn render_png<F: Figure>(fig: &F) -> anyhow::Result<Vec<u8>> {
    let (w, h, buf) = render_rgb(fig)?;
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(BufWriter::new(&mut out), w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().context("encoding PNG")?;
        wr.write_image_data(&buf).context("encoding PNG")?;
        wr.finish().context("encoding PNG")?;
    }
    Ok(out)
}

/// Renders a figure as an SVG document.
pub fn render_svg<F: Figure>(fig: &F) -> anyhow::Result<String> {
    register_fonts()?;
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, fig.size()).into_drawing_area();
        fig.draw(&root)?;
        root.present().map_err(de)?;
    }
    Ok(s)
}

/// Writes a figure to `path`, PNG or SVG by its extension.
pub fn save<F: Figure>(fig: &F, path: &Path) -> anyhow::Result<()> {
    let bytes = match format_of(path)? {
        Format::Png => render_png(fig)?,
        Format::Svg => render_svg(fig)?.into_bytes(),
    };
    std::fs::write(path, bytes).with_context(|| format!("{}: cannot write", path.display()))
}

/// Series colours (Tableau 10, then the light shades of Tableau 20).
pub fn series_color(i: usize) -> RGBColor {
    const C: [(u8, u8, u8); 20] = [
        (31, 119, 180),
        (214, 39, 40),
        (44, 160, 44),
        (255, 127, 14),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
        (174, 199, 232),
        (255, 152, 150),
        (152, 223, 138),
        (255, 187, 120),
        (197, 176, 213),
        (196, 156, 148),
        (247, 182, 210),
        (199, 199, 199),
        (219, 219, 141),
        (158, 218, 229),
    ];
    let (r, g, b) = C[i % C.len()];
    RGBColor(r, g, b)
}

fn text_style(text: &str, size: f64) -> TextStyle<'static> {
    TextStyle::from((family_for(text), size).into_font()).color(&BLACK)
}

fn draw_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    size: f64,
    pos: (i32, i32),
    h: HPos,
    v: VPos,
    rotate: bool,
) -> anyhow::Result<()> {
    let mut st = text_style(text, size).pos(Pos::new(h, v));
    if rotate {
        st = st.transform(FontTransform::Rotate90);
    }
    area.draw_text(text, &st, pos).map_err(de)
}

// ---------------------------------------------------------------------------------------------
// Attention heatmap (Fig. 6)
// ---------------------------------------------------------------------------------------------

/// Attention heatmap of one translation: source tokens on x, output tokens on y, shade =
/// weight (white 0 … black 1), and the per-step gate values as horizontal bars to the right of
/// the output rows when present.
#[derive(Debug, Clone)]
pub struct AttentionFigure {
    /// Title.
    pub title: String,
    /// Source tokens (columns).
    pub src: Vec<String>,
    /// Output tokens (rows).
    pub hyp: Vec<String>,
    /// Weights, `attention[row][column]`.
    pub attention: Vec<Vec<f64>>,
    /// Gate value per output token (may be shorter than `hyp`, or empty).
    pub gates: Vec<f64>,
    cell: u32,
    font: f64,
    left: u32,
    top: u32,
    bottom: u32,
    gate_w: u32,
    width: u32,
}

impl AttentionFigure {
    /// Builds the figure of one dump record, checking that the attention matrix has one row
    /// per output token and one column per source token.
    pub fn from_record(rec: &DumpRecord) -> anyhow::Result<Self> {
        let id = rec.id.unwrap_or(0);
        if rec.attention.is_empty() {
            bail!("record {id} has no attention matrix");
        }
        let (rows, cols) = (rec.attention.len(), rec.attention[0].len());
        if cols == 0 {
            bail!("record {id}: attention rows are empty");
        }
        if let Some((k, r)) = rec
            .attention
            .iter()
            .enumerate()
            .find(|(_, r)| r.len() != cols)
        {
            bail!(
                "record {id}: attention row {k} has {} weights but row 0 has {cols}",
                r.len()
            );
        }
        let label = |toks: &[String], n: usize, what: &str| -> anyhow::Result<Vec<String>> {
            if toks.is_empty() {
                Ok((0..n).map(|i| format!("#{i}")).collect())
            } else if toks.len() == n {
                Ok(toks.to_vec())
            } else {
                bail!(
                    "record {id}: {} {what} tokens but the attention matrix has {n} {}",
                    toks.len(),
                    if what == "source" { "columns" } else { "rows" }
                )
            }
        };
        let src = label(&rec.src, cols, "source")?;
        let hyp = label(&rec.hyp, rows, "output")?;
        let score = rec
            .score
            .map(|s| format!(", score {s:.2}"))
            .unwrap_or_default();
        let title = format!("Attention, sentence {id}{score}");
        Ok(Self::new(
            title,
            src,
            hyp,
            rec.attention.clone(),
            rec.gates.clone(),
        ))
    }

    /// Builds the figure from its parts (the attention matrix must be `hyp.len() × src.len()`).
    pub fn new(
        title: String,
        src: Vec<String>,
        hyp: Vec<String>,
        attention: Vec<Vec<f64>>,
        gates: Vec<f64>,
    ) -> Self {
        let n = src.len().max(hyp.len());
        let cell: u32 = match n {
            0..=25 => 30,
            26..=45 => 22,
            46..=70 => 16,
            _ => 12,
        };
        let font = (cell as f64 * 0.62).clamp(11.0, 17.0);
        let maxw = |v: &[String]| v.iter().map(|t| text_width(t, font)).fold(0.0, f64::max);
        let left = (maxw(&hyp) + 16.0).ceil() as u32;
        let bottom = (maxw(&src) + 16.0).ceil() as u32;
        let top = 48;
        let has_gate = gates.iter().any(|g| g.is_finite());
        let gate_w = if has_gate { 130 } else { 0 };
        let title_w = text_width(&title, 20.0).ceil() as u32 + 40;
        let width = (left + cell * src.len() as u32 + gate_w + 30).max(title_w);
        AttentionFigure {
            title,
            src,
            hyp,
            attention,
            gates,
            cell,
            font,
            left,
            top,
            bottom: bottom.max(if has_gate { 40 } else { 0 }),
            gate_w,
            width,
        }
    }
}

fn shade(w: f64) -> RGBColor {
    if !w.is_finite() {
        return RGBColor(255, 200, 200);
    }
    let v = (255.0 * (1.0 - w.clamp(0.0, 1.0))).round() as u8;
    RGBColor(v, v, v)
}

impl Figure for AttentionFigure {
    fn size(&self) -> (u32, u32) {
        (
            self.width,
            self.top + self.cell * self.hyp.len() as u32 + self.bottom + 10,
        )
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        root.fill(&WHITE).map_err(de)?;
        let (c, l, t) = (self.cell as i32, self.left as i32, self.top as i32);
        let (ns, nt) = (self.src.len() as i32, self.hyp.len() as i32);
        draw_text(
            root,
            &self.title,
            20.0,
            (self.width as i32 / 2, 12),
            HPos::Center,
            VPos::Top,
            false,
        )?;
        for (i, row) in self.attention.iter().enumerate() {
            for (j, &w) in row.iter().enumerate() {
                let (x0, y0) = (l + j as i32 * c, t + i as i32 * c);
                root.draw(&Rectangle::new(
                    [(x0, y0), (x0 + c, y0 + c)],
                    shade(w).filled(),
                ))
                .map_err(de)?;
            }
        }
        // Thin grid and frame.
        let grid = RGBColor(220, 220, 220).stroke_width(1);
        for j in 1..ns {
            let x = l + j * c;
            root.draw(&PathElement::new(vec![(x, t), (x, t + nt * c)], grid))
                .map_err(de)?;
        }
        for i in 1..nt {
            let y = t + i * c;
            root.draw(&PathElement::new(vec![(l, y), (l + ns * c, y)], grid))
                .map_err(de)?;
        }
        root.draw(&Rectangle::new(
            [(l, t), (l + ns * c, t + nt * c)],
            BLACK.stroke_width(1),
        ))
        .map_err(de)?;
        for (i, tok) in self.hyp.iter().enumerate() {
            let y = t + i as i32 * c + c / 2;
            draw_text(
                root,
                tok,
                self.font,
                (l - 8, y),
                HPos::Right,
                VPos::Center,
                false,
            )?;
        }
        for (j, tok) in self.src.iter().enumerate() {
            let x = l + j as i32 * c + c / 2;
            // Rotated 90° clockwise: the text runs downwards from just below the matrix.
            draw_text(
                root,
                tok,
                self.font,
                (x, t + nt * c + 8),
                HPos::Left,
                VPos::Center,
                true,
            )?;
        }
        if self.gate_w > 0 {
            let gx = l + ns * c + 24;
            let gw = self.gate_w as i32 - 40;
            let frame = RGBColor(120, 120, 120);
            root.draw(&Rectangle::new(
                [(gx, t), (gx + gw, t + nt * c)],
                frame.stroke_width(1),
            ))
            .map_err(de)?;
            let mid = gx + gw / 2;
            root.draw(&PathElement::new(
                vec![(mid, t), (mid, t + nt * c)],
                RGBColor(200, 200, 200).stroke_width(1),
            ))
            .map_err(de)?;
            let bar = RGBColor(70, 130, 180);
            for (i, &g) in self.gates.iter().enumerate().take(self.hyp.len()) {
                if !g.is_finite() {
                    continue;
                }
                let y0 = t + i as i32 * c + c / 6;
                let y1 = t + (i as i32 + 1) * c - c / 6;
                let x1 = gx + (g.clamp(0.0, 1.0) * gw as f64).round() as i32;
                root.draw(&Rectangle::new(
                    [(gx, y0), (x1.max(gx + 1), y1)],
                    bar.filled(),
                ))
                .map_err(de)?;
            }
            draw_text(
                root,
                "gate",
                15.0,
                (mid, t - 4),
                HPos::Center,
                VPos::Bottom,
                false,
            )?;
            for (v, x) in [("0", gx), ("0.5", mid), ("1", gx + gw)] {
                draw_text(
                    root,
                    v,
                    12.0,
                    (x, t + nt * c + 4),
                    HPos::Center,
                    VPos::Top,
                    false,
                )?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Category charts (Fig. 7, Fig. 2a)
// ---------------------------------------------------------------------------------------------

/// One panel: series of values over categories, drawn as lines with markers.
#[derive(Debug, Clone)]
pub struct CategoryPanel {
    /// Panel title.
    pub title: String,
    /// x-axis description.
    pub x_desc: String,
    /// y-axis description.
    pub y_desc: String,
    /// Category labels (x).
    pub categories: Vec<String>,
    /// `(name, value per category)`; `None` leaves a gap.
    pub series: Vec<(String, Vec<Option<f64>>)>,
}

/// Panels side by side.
#[derive(Debug, Clone)]
pub struct CategoryFigure {
    /// The panels, left to right.
    pub panels: Vec<CategoryPanel>,
    /// Size of one panel in pixels.
    pub panel_size: (u32, u32),
}

/// Number of decimals for tick labels of an axis spanning `span`.
fn decimals(span: f64) -> usize {
    if span >= 8.0 {
        0
    } else if span >= 0.8 {
        1
    } else if span >= 0.08 {
        2
    } else {
        3
    }
}

/// Step label: `2500`, or `2.5k` / `10k` when the axis reaches 10000.
fn step_label(v: f64, xmax: f64) -> String {
    if xmax >= 10000.0 && v != 0.0 {
        let k = v / 1000.0;
        if (k - k.round()).abs() < 1e-9 {
            format!("{k:.0}k")
        } else {
            format!("{k:.1}k")
        }
    } else {
        format!("{v:.0}")
    }
}

fn y_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let span = if hi > lo { hi - lo } else { hi.abs().max(1.0) };
    let pad = 0.12 * span;
    let lo2 = if lo >= 0.0 && lo - pad < 0.0 {
        0.0
    } else {
        lo - pad
    };
    (lo2, hi + pad)
}

fn draw_category_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &CategoryPanel,
) -> anyhow::Result<()> {
    let n = p.categories.len().max(1) as i32;
    let (lo, hi) = y_range(p.series.iter().flat_map(|s| s.1.iter().flatten().copied()));
    let legend = p.series.len() > 1;
    // Headroom for the legend box, which goes in the upper corner where the data are lower.
    let hi = if legend {
        hi + (hi - lo) * 0.1 * p.series.len() as f64
    } else {
        hi
    };
    let third = (p.categories.len() / 3).max(1);
    let side_max = |range: std::ops::Range<usize>| {
        p.series
            .iter()
            .flat_map(|s| {
                s.1.get(range.clone())
                    .unwrap_or(&[])
                    .iter()
                    .flatten()
                    .copied()
            })
            .fold(f64::NEG_INFINITY, f64::max)
    };
    let n_cat = p.categories.len();
    let legend_pos =
        if side_max(0..third.min(n_cat)) <= side_max(n_cat.saturating_sub(third)..n_cat) {
            SeriesLabelPosition::UpperLeft
        } else {
            SeriesLabelPosition::UpperRight
        };
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (SANS, 20))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(60)
        // An i32 range includes its end; a single category gets an empty slot after it.
        .build_cartesian_2d((0..(n - 1).max(1)).into_segmented(), lo..hi)
        .map_err(de)?;
    let cats = p.categories.clone();
    let fmt = move |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            cats.get(*i as usize).cloned().unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n as usize + 1)
        .x_label_formatter(&fmt)
        .y_labels(8)
        .y_label_formatter(&|v: &f64| format!("{v:.d$}", d = decimals(hi - lo)))
        .x_desc(p.x_desc.as_str())
        .y_desc(p.y_desc.as_str())
        .label_style((SANS, 15))
        .axis_desc_style((SANS, 16))
        .light_line_style(RGBColor(242, 242, 242))
        .draw()
        .map_err(de)?;
    for (k, (name, vals)) in p.series.iter().enumerate() {
        let col = series_color(k);
        let style = col.stroke_width(2);
        // Break the line at missing values.
        let mut runs: Vec<Vec<(SegmentValue<i32>, f64)>> = vec![Vec::new()];
        for (i, v) in vals.iter().enumerate() {
            match v {
                Some(x) if x.is_finite() => runs
                    .last_mut()
                    .expect("non-empty")
                    .push((SegmentValue::CenterOf(i as i32), *x)),
                _ => runs.push(Vec::new()),
            }
        }
        let mut first = true;
        for run in runs.into_iter().filter(|r| !r.is_empty()) {
            let pts = run.clone();
            let s = chart.draw_series(LineSeries::new(pts, style)).map_err(de)?;
            if first {
                s.label(name.as_str()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], col.stroke_width(3))
                });
                first = false;
            }
            chart
                .draw_series(run.into_iter().map(|p| Circle::new(p, 4, col.filled())))
                .map_err(de)?;
        }
    }
    if legend {
        chart
            .configure_series_labels()
            .position(legend_pos)
            .label_font((SANS, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(de)?;
    }
    Ok(())
}

impl Figure for CategoryFigure {
    fn size(&self) -> (u32, u32) {
        (
            self.panel_size.0 * self.panels.len().max(1) as u32,
            self.panel_size.1,
        )
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        root.fill(&WHITE).map_err(de)?;
        let areas = root.split_evenly((1, self.panels.len().max(1)));
        for (a, p) in areas.iter().zip(&self.panels) {
            draw_category_panel(a, p)?;
        }
        Ok(())
    }
}

/// Fig. 7: BLEU (left) and mean output length (right) per source-length group, one series per
/// system.
pub fn length_groups_figure(g: &LengthGroups) -> CategoryFigure {
    let cats: Vec<String> = g.buckets.iter().map(|b| b.label.clone()).collect();
    let names: Vec<String> = g
        .buckets
        .first()
        .map(|b| b.systems.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default();
    let series = |f: &dyn Fn(&crate::analysis::SystemBucket) -> Option<f64>| {
        names
            .iter()
            .enumerate()
            .map(|(k, n)| {
                (
                    n.clone(),
                    g.buckets.iter().map(|b| f(&b.systems[k])).collect(),
                )
            })
            .collect::<Vec<_>>()
    };
    let mut len_series = series(&|s| s.mean_len);
    len_series.push((
        "reference".into(),
        g.buckets.iter().map(|b| b.mean_ref_len).collect(),
    ));
    CategoryFigure {
        panels: vec![
            CategoryPanel {
                title: "BLEU by source length".into(),
                x_desc: "source sentence length (words)".into(),
                y_desc: "BLEU".into(),
                categories: cats.clone(),
                series: series(&|s| s.bleu),
            },
            CategoryPanel {
                title: "Output length by source length".into(),
                x_desc: "source sentence length (words)".into(),
                y_desc: "mean output length (words)".into(),
                categories: cats,
                series: len_series,
            },
        ],
        panel_size: (640, 480),
    }
}

/// Fig. 2a: translation length ratio (left) and BLEU (right) per context-scaling setting.
pub fn context_scaling_figure(c: &ContextScaling) -> CategoryFigure {
    let cats: Vec<String> = c
        .runs
        .iter()
        .map(|r| crate::analysis::scale_label(r.a, r.b))
        .collect();
    CategoryFigure {
        panels: vec![
            CategoryPanel {
                title: "Translation length ratio".into(),
                x_desc: "(a, b) = (source scale, target scale)".into(),
                y_desc: "length ratio".into(),
                categories: cats.clone(),
                series: vec![
                    (
                        "output / source".into(),
                        c.runs.iter().map(|r| r.ratio_src).collect(),
                    ),
                    (
                        "output / reference".into(),
                        c.runs.iter().map(|r| r.ratio_ref).collect(),
                    ),
                ],
            },
            CategoryPanel {
                title: "BLEU".into(),
                x_desc: "(a, b) = (source scale, target scale)".into(),
                y_desc: "BLEU".into(),
                categories: cats,
                series: vec![("BLEU".into(), c.runs.iter().map(|r| Some(r.bleu)).collect())],
            },
        ],
        panel_size: (620, 460),
    }
}

// ---------------------------------------------------------------------------------------------
// Training curves
// ---------------------------------------------------------------------------------------------

/// Training loss per token (left) and dev BLEU (right) against the update step.
#[derive(Debug, Clone)]
pub struct TrainingFigure {
    /// The parsed log.
    pub log: TrainingLog,
    /// Title prefix (e.g. the log's file name).
    pub title: String,
}

/// `(name, points, draw markers)` of an x-y panel.
type XySeries<'a> = (&'a str, Vec<(f64, f64)>, bool);

fn xy_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    y_desc: &str,
    series: &[XySeries],
    legend: SeriesLabelPosition,
) -> anyhow::Result<()> {
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    if all.is_empty() {
        let (w, h) = area.dim_in_pixel();
        draw_text(
            area,
            title,
            20.0,
            (w as i32 / 2, 16),
            HPos::Center,
            VPos::Top,
            false,
        )?;
        draw_text(
            area,
            "(no data in the log)",
            16.0,
            (w as i32 / 2, h as i32 / 2),
            HPos::Center,
            VPos::Center,
            false,
        )?;
        return Ok(());
    }
    let xmax = all.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let xmin = all
        .iter()
        .map(|p| p.0)
        .fold(f64::INFINITY, f64::min)
        .min(0.0);
    let xmax = if xmax > xmin { xmax } else { xmin + 1.0 };
    let (lo, hi) = y_range(all.iter().map(|p| p.1));
    let mut chart = ChartBuilder::on(area)
        .caption(title, (SANS, 20))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(xmin..xmax * 1.02, lo..hi)
        .map_err(de)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(y_desc)
        .x_labels(6)
        .x_label_formatter(&|v: &f64| step_label(*v, xmax))
        .y_labels(8)
        .y_label_formatter(&|v: &f64| format!("{v:.d$}", d = decimals(hi - lo)))
        .label_style((SANS, 15))
        .axis_desc_style((SANS, 16))
        .light_line_style(RGBColor(242, 242, 242))
        .draw()
        .map_err(de)?;
    for (k, (name, pts, markers)) in series.iter().enumerate() {
        let col = series_color(k);
        let pts: Vec<(f64, f64)> = pts
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        if pts.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))
            .map_err(de)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], col.stroke_width(3)));
        if *markers {
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, col.filled())))
                .map_err(de)?;
        }
    }
    if series.len() > 1 {
        chart
            .configure_series_labels()
            .position(legend)
            .label_font((SANS, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(de)?;
    }
    Ok(())
}

impl Figure for TrainingFigure {
    fn size(&self) -> (u32, u32) {
        (1240, 480)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        root.fill(&WHITE).map_err(de)?;
        let areas = root.split_evenly((1, 2));
        let train: Vec<(f64, f64)> = self
            .log
            .steps
            .iter()
            .map(|s| (s.step, s.loss_per_token))
            .collect();
        let dev_loss: Vec<(f64, f64)> = self
            .log
            .evals
            .iter()
            .filter_map(|e| e.loss_per_token.map(|l| (e.step, l)))
            .collect();
        let bleu: Vec<(f64, f64)> = self
            .log
            .evals
            .iter()
            .filter_map(|e| e.dev_bleu.map(|b| (e.step, b)))
            .collect();
        let mut loss_series = vec![("train", train, false)];
        if !dev_loss.is_empty() {
            loss_series.push(("dev", dev_loss, true));
        }
        let t = |s: &str| {
            if self.title.is_empty() {
                s.to_string()
            } else {
                format!("{s} ({})", self.title)
            }
        };
        xy_panel(
            &areas[0],
            &t("Loss per token"),
            "loss per token",
            &loss_series,
            SeriesLabelPosition::UpperRight,
        )?;
        xy_panel(
            &areas[1],
            &t("Dev BLEU"),
            "BLEU",
            &[("dev BLEU", bleu, true)],
            SeriesLabelPosition::UpperRight,
        )?;
        Ok(())
    }
}

/// Several named series against the update step in one panel (e.g. every system's dev BLEU).
#[derive(Debug, Clone)]
pub struct StepCurvesFigure {
    /// Panel title.
    pub title: String,
    /// y-axis description.
    pub y_desc: String,
    /// `(name, (step, value) points)`.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

impl Figure for StepCurvesFigure {
    fn size(&self) -> (u32, u32) {
        (1000, 600)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        root.fill(&WHITE).map_err(de)?;
        let series: Vec<XySeries> = self
            .series
            .iter()
            .map(|(n, p)| (n.as_str(), p.clone(), true))
            .collect();
        // Curves that rise end at the upper right: the legend goes below them.
        xy_panel(
            root,
            &self.title,
            &self.y_desc,
            &series,
            SeriesLabelPosition::LowerRight,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fonts_register_and_pick_family() {
        register_fonts().unwrap();
        assert_eq!(family_for("love"), SANS);
        assert_eq!(family_for("</s>"), SANS);
        assert_eq!(family_for("我爱"), CJK);
        assert!(text_width("love", 16.0) > 10.0);
        assert!(text_width("我爱", 16.0) > 20.0);
        assert_eq!(format_of(Path::new("a/b.PNG")).unwrap(), Format::Png);
        assert_eq!(format_of(Path::new("b.svg")).unwrap(), Format::Svg);
        assert!(format_of(Path::new("b.pdf")).is_err());
        assert!(format_of(Path::new("b")).is_err());
    }

    #[test]
    fn degenerate_category_and_training_figures_render() {
        for n in 0..3 {
            let fig = CategoryFigure {
                panels: vec![CategoryPanel {
                    title: "t".into(),
                    x_desc: "x".into(),
                    y_desc: "y".into(),
                    categories: (0..n).map(|i| format!("c{i}")).collect(),
                    series: vec![
                        ("a".into(), (0..n).map(|i| Some(i as f64)).collect()),
                        ("b".into(), vec![None; n]),
                    ],
                }],
                panel_size: (300, 200),
            };
            render_rgb(&fig).unwrap();
            render_svg(&fig).unwrap();
        }
        use crate::analysis::{EvalPoint, StepPoint};
        let one = TrainingFigure {
            log: TrainingLog {
                steps: vec![StepPoint {
                    step: 5.0,
                    epoch: None,
                    seconds: None,
                    loss_per_token: f64::NAN,
                    tgt_tok_per_s: None,
                }],
                evals: vec![EvalPoint {
                    step: 5.0,
                    epoch: None,
                    seconds: None,
                    loss_per_token: None,
                    dev_bleu: Some(3.0),
                }],
            },
            title: String::new(),
        };
        render_rgb(&one).unwrap();
    }

    #[test]
    fn y_range_pads_and_handles_degenerate() {
        assert_eq!(y_range(std::iter::empty()), (0.0, 1.0));
        let (lo, hi) = y_range([10.0, 20.0].into_iter());
        assert!((lo - 8.8).abs() < 1e-9 && (hi - 21.2).abs() < 1e-9);
        let (lo, hi) = y_range([5.0].into_iter());
        assert!(lo < 5.0 && hi > 5.0);
        let (lo, _) = y_range([0.1, 10.0].into_iter());
        assert_eq!(lo, 0.0);
    }
}
