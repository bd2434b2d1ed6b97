//! A plotters drawing backend on a 2D canvas context, in CSS pixels: the caller sizes the
//! canvas's backing store by `devicePixelRatio` and scales the context, so charts are sharp on
//! HiDPI screens while the chart code and the mouse mapping stay in CSS pixels.
//!
//! Unlike `plotters-canvas` it measures text with `measureText` (plotters' wasm fallback adds a
//! `<span>` to the page and forces a layout for every label it measures) and sends a color,
//! font or line width to the context only when it changes.

use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
    FontTransform,
};
use web_sys::CanvasRenderingContext2d;

/// The canvas refused a call (a JS exception, as text).
#[derive(Debug)]
pub struct CanvasError(String);

impl std::fmt::Display for CanvasError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "canvas error: {}", self.0)
    }
}

impl std::error::Error for CanvasError {}

fn js_err(e: wasm_bindgen::JsValue) -> DrawingErrorKind<CanvasError> {
    DrawingErrorKind::DrawingError(CanvasError(format!("{e:?}")))
}

type Rgba = ((u8, u8, u8), u64);

fn key(c: BackendColor) -> Rgba {
    (c.rgb, c.alpha.to_bits())
}

fn css_color(c: BackendColor) -> String {
    let (r, g, b) = c.rgb;
    if c.alpha >= 1.0 {
        format!("rgb({r},{g},{b})")
    } else {
        format!("rgba({r},{g},{b},{:.3})", c.alpha.max(0.0))
    }
}

/// Draws on a canvas context whose transform maps CSS pixels to device pixels.
pub struct CanvasPainter {
    ctx: CanvasRenderingContext2d,
    /// Size in CSS pixels.
    size: (u32, u32),
    /// Device pixels per CSS pixel.
    dpr: f64,
    fill: Option<Rgba>,
    stroke: Option<Rgba>,
    line_width: f64,
    font: String,
    align: &'static str,
    baseline: &'static str,
}

impl CanvasPainter {
    pub fn new(ctx: CanvasRenderingContext2d, size: (u32, u32), dpr: f64) -> Self {
        Self {
            ctx,
            size,
            dpr,
            fill: None,
            stroke: None,
            line_width: -1.0,
            font: String::new(),
            align: "",
            baseline: "",
        }
    }

    fn set_fill(&mut self, c: BackendColor) {
        if self.fill != Some(key(c)) {
            self.fill = Some(key(c));
            self.ctx.set_fill_style_str(&css_color(c));
        }
    }

    fn set_stroke(&mut self, style: &impl BackendStyle) {
        let c = style.color();
        if self.stroke != Some(key(c)) {
            self.stroke = Some(key(c));
            self.ctx.set_stroke_style_str(&css_color(c));
        }
        let w = f64::from(style.stroke_width());
        if self.line_width != w {
            self.line_width = w;
            self.ctx.set_line_width(w);
        }
    }

    fn set_font(&mut self, style: &impl BackendTextStyle) {
        let font = format!(
            "{} {}px {}",
            style.style().as_str(),
            style.size(),
            style.family().as_str()
        );
        if self.font != font {
            self.ctx.set_font(&font);
            self.font = font;
        }
    }

    /// Half a device pixel off integer coordinates for a line whose width is an odd number of
    /// device pixels, so horizontal and vertical lines are crisp.
    fn crisp_offset(&self) -> f64 {
        let device = (self.line_width * self.dpr).round() as i64;
        if device % 2 == 1 { 0.5 / self.dpr } else { 0.0 }
    }
}

impl DrawingBackend for CanvasPainter {
    type ErrorType = CanvasError;

    fn get_size(&self) -> (u32, u32) {
        self.size
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<CanvasError>> {
        Ok(())
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<CanvasError>> {
        Ok(())
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        if color.alpha == 0.0 {
            return Ok(());
        }
        self.set_fill(color);
        self.ctx
            .fill_rect(f64::from(point.0), f64::from(point.1), 1.0, 1.0);
        Ok(())
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        if style.color().alpha == 0.0 {
            return Ok(());
        }
        self.set_stroke(style);
        let o = self.crisp_offset();
        let (mut a, mut b) = (
            (f64::from(from.0), f64::from(from.1)),
            (f64::from(to.0), f64::from(to.1)),
        );
        if from.0 == to.0 {
            a.0 -= o;
            b.0 -= o;
        }
        if from.1 == to.1 {
            a.1 -= o;
            b.1 -= o;
        }
        self.ctx.begin_path();
        self.ctx.move_to(a.0, a.1);
        self.ctx.line_to(b.0, b.1);
        self.ctx.stroke();
        Ok(())
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        if style.color().alpha == 0.0 {
            return Ok(());
        }
        let (x, y) = (f64::from(upper_left.0), f64::from(upper_left.1));
        let (w, h) = (
            f64::from(bottom_right.0 - upper_left.0),
            f64::from(bottom_right.1 - upper_left.1),
        );
        if fill {
            self.set_fill(style.color());
            self.ctx.fill_rect(x, y, w, h);
        } else {
            self.set_stroke(style);
            self.ctx.stroke_rect(x, y, w, h);
        }
        Ok(())
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        if style.color().alpha == 0.0 {
            return Ok(());
        }
        let mut path = path.into_iter();
        let Some(first) = path.next() else {
            return Ok(());
        };
        self.set_stroke(style);
        self.ctx.begin_path();
        self.ctx.move_to(f64::from(first.0), f64::from(first.1));
        for p in path {
            self.ctx.line_to(f64::from(p.0), f64::from(p.1));
        }
        self.ctx.stroke();
        Ok(())
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        if style.color().alpha == 0.0 {
            return Ok(());
        }
        let mut vert = vert.into_iter();
        let Some(first) = vert.next() else {
            return Ok(());
        };
        self.set_fill(style.color());
        self.ctx.begin_path();
        self.ctx.move_to(f64::from(first.0), f64::from(first.1));
        for p in vert {
            self.ctx.line_to(f64::from(p.0), f64::from(p.1));
        }
        self.ctx.close_path();
        self.ctx.fill();
        Ok(())
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        if style.color().alpha == 0.0 {
            return Ok(());
        }
        if fill {
            self.set_fill(style.color());
        } else {
            self.set_stroke(style);
        }
        self.ctx.begin_path();
        self.ctx
            .arc(
                f64::from(center.0),
                f64::from(center.1),
                f64::from(radius),
                0.0,
                std::f64::consts::TAU,
            )
            .map_err(js_err)?;
        if fill {
            self.ctx.fill();
        } else {
            self.ctx.stroke();
        }
        Ok(())
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<CanvasError>> {
        // `&self`: measure with the font set for this call, then put the current one back.
        let font = format!(
            "{} {}px {}",
            style.style().as_str(),
            style.size(),
            style.family().as_str()
        );
        if font != self.font {
            self.ctx.set_font(&font);
        }
        let width = self.ctx.measure_text(text).map_err(js_err)?.width();
        if font != self.font && !self.font.is_empty() {
            self.ctx.set_font(&self.font);
        }
        // A line box of the browser's default line height (about 1.15 em).
        Ok((width.ceil() as u32, (style.size() * 1.15).round() as u32))
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let (mut x, mut y) = (f64::from(pos.0), f64::from(pos.1));
        let degrees: f64 = match style.transform() {
            FontTransform::None => 0.0,
            FontTransform::Rotate90 => 90.0,
            FontTransform::Rotate180 => 180.0,
            FontTransform::Rotate270 => 270.0,
        };
        if degrees != 0.0 {
            self.ctx.save();
            self.ctx.translate(x, y).map_err(js_err)?;
            self.ctx.rotate(degrees.to_radians()).map_err(js_err)?;
            (x, y) = (0.0, 0.0);
        }
        let baseline = match style.anchor().v_pos {
            VPos::Top => "top",
            VPos::Center => "middle",
            VPos::Bottom => "bottom",
        };
        if self.baseline != baseline {
            self.baseline = baseline;
            self.ctx.set_text_baseline(baseline);
        }
        let align = match style.anchor().h_pos {
            HPos::Left => "start",
            HPos::Right => "end",
            HPos::Center => "center",
        };
        if self.align != align {
            self.align = align;
            self.ctx.set_text_align(align);
        }
        self.set_fill(color);
        self.set_font(style);
        self.ctx.fill_text(text, x, y).map_err(js_err)?;
        if degrees != 0.0 {
            self.ctx.restore();
            // `restore` brings back the state saved before: forget what we set since.
            self.fill = None;
            self.font.clear();
            self.align = "";
            self.baseline = "";
        }
        Ok(())
    }
}
