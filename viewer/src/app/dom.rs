//! Browser glue: theme, URL, downloads, clipboard, timers. Small wrappers so the components
//! read as what they do; every failure here is non-fatal and reported to the caller as `None`
//! or `Err(String)`.

use leptos::prelude::window;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

use crate::chart::{ChartSpec, Mapper, Theme};
use crate::state::parse_pairs;

/// What a JavaScript exception says, in words: an `Error`'s message (`TypeError: Failed to
/// fetch`), a thrown string, or that nothing more is known; never a `JsValue(…)` dump.
pub fn js_error(e: &JsValue) -> String {
    if let Some(err) = e.dyn_ref::<js_sys::Error>() {
        let name = String::from(err.name());
        let message = String::from(err.message());
        return if name.is_empty() || name == "Error" {
            message
        } else {
            format!("{name}: {message}")
        };
    }
    e.as_string()
        .unwrap_or_else(|| String::from("the browser gave no reason"))
}

/// The origin (`https://host:port`) of `url`, read relative to the page (`None` for a URL
/// the browser cannot parse).
pub fn origin_of(url: &str) -> Option<String> {
    let base = window().location().href().ok()?;
    Some(web_sys::Url::new_with_base(url, &base).ok()?.origin())
}

/// The page's own origin.
pub fn page_origin() -> String {
    window().location().origin().unwrap_or_default()
}

/// Whether the system asks for a dark page.
pub fn prefers_dark() -> bool {
    window()
        .match_media("(prefers-color-scheme: dark)")
        .ok()
        .flatten()
        .is_some_and(|m| m.matches())
}

/// Chart colors for the current system theme.
pub fn theme() -> Theme {
    if prefers_dark() {
        Theme::DARK
    } else {
        Theme::LIGHT
    }
}

/// A query-string parameter of the page URL (`?trace=...`, `?demo=...`, `?embed=1`).
pub fn query_param(name: &str) -> Option<String> {
    let search = window().location().search().ok()?;
    parse_pairs(&search)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// The page URL fragment (without `#`).
pub fn fragment() -> String {
    window()
        .location()
        .hash()
        .unwrap_or_default()
        .trim_start_matches('#')
        .to_string()
}

/// Replaces the fragment without adding a history entry or firing `hashchange`.
pub fn replace_fragment(fragment: &str) {
    if window().location().hash().ok().as_deref() == Some(format!("#{fragment}").as_str()) {
        return;
    }
    if let Ok(h) = window().history() {
        let _ = h.replace_state_with_url(&JsValue::NULL, "", Some(&format!("#{fragment}")));
    }
}

/// Replaces the query string (keeps the fragment), e.g. after opening a demo.
pub fn replace_query(query: &str, fragment: &str) {
    if let Ok(h) = window().history() {
        let loc = window().location();
        let q = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        // `replaceState` takes milliseconds: not when nothing changes.
        if loc.search().ok().as_deref() == Some(q.as_str())
            && loc.hash().ok().as_deref() == Some(format!("#{fragment}").as_str())
        {
            return;
        }
        let path = loc.pathname().unwrap_or_default();
        let _ =
            h.replace_state_with_url(&JsValue::NULL, "", Some(&format!("{path}{q}#{fragment}")));
    }
}

/// The link that reopens the current view: page URL (with its `?trace=`) plus `fragment`.
pub fn share_url(fragment: &str) -> String {
    let loc = window().location();
    format!(
        "{}{}{}#{fragment}",
        loc.origin().unwrap_or_default(),
        loc.pathname().unwrap_or_default(),
        loc.search().unwrap_or_default()
    )
}

/// Uploads `body` to the `gpucollect serve` that serves this page; returns the share link
/// (absolute, with `fragment`). Fails with a readable reason on a static host.
pub async fn upload_trace(body: &web_sys::Blob, fragment: &str) -> Result<String, String> {
    let init = web_sys::RequestInit::new();
    init.set_method("POST");
    init.set_body(body);
    let resp = JsFuture::from(window().fetch_with_str_and_init("api/v1/traces", &init))
        .await
        .map_err(|e| format!("the upload failed: {}", js_error(&e)))?;
    let resp: web_sys::Response = resp.unchecked_into();
    let json = JsFuture::from(resp.json().map_err(|e| js_error(&e))?)
        .await
        .map_err(|_| String::from("sharing needs this page to be served by `gpucollect serve`"))?;
    let field = |k: &str| {
        js_sys::Reflect::get(&json, &JsValue::from_str(k))
            .ok()
            .and_then(|v| v.as_string())
    };
    if resp.status() != 201 {
        return Err(
            field("error").unwrap_or_else(|| format!("the server answered {}", resp.status()))
        );
    }
    let link = field("link").ok_or("the server's answer has no link")?;
    Ok(format!(
        "{}{link}#{fragment}",
        window().location().origin().unwrap_or_default()
    ))
}

/// The content of the page's `<meta name="NAME">`, if it has one.
pub fn meta_content(name: &str) -> Option<String> {
    window()
        .document()?
        .query_selector(&format!("meta[name=\"{name}\"]"))
        .ok()??
        .get_attribute("content")
}

/// The trace embedded in the page by `gpucollect html` (base64 in
/// `<script id="gpucollect-embedded-trace">`), if any.
pub fn embedded_trace() -> Option<Vec<u8>> {
    let el = window()
        .document()?
        .get_element_by_id("gpucollect-embedded-trace")?;
    let text = el.text_content()?;
    let binary = window().atob(text.trim()).ok()?;
    Some(binary.chars().map(|c| c as u32 as u8).collect())
}

/// A Blob holding `bytes`.
pub fn blob_of(bytes: &[u8]) -> Option<web_sys::Blob> {
    let arr = js_sys::Array::new();
    arr.push(&js_sys::Uint8Array::from(bytes));
    web_sys::Blob::new_with_u8_array_sequence(&arr).ok()
}

/// Copies text to the clipboard (best effort: fails without permission or focus).
pub async fn copy_text(text: &str) -> Result<(), String> {
    let p = window().navigator().clipboard().write_text(text);
    JsFuture::from(p)
        .await
        .map(|_| ())
        .map_err(|e| js_error(&e))
}

/// Milliseconds since page load (high resolution).
pub fn now_ms() -> f64 {
    window().performance().map_or(0.0, |p| p.now())
}

/// A named moment on the page's performance timeline (`performance.mark`), for the benchmark's
/// phase times.
pub fn mark(name: &str) {
    if let Some(p) = window().performance() {
        let _ = p.mark(name);
    }
}

/// Whether the page shows a drawn timeline.
pub fn timeline_drawn() -> bool {
    leptos::prelude::document()
        .query_selector(r#"canvas[data-testid="timeline-canvas"][data-drawn-at]"#)
        .ok()
        .flatten()
        .is_some()
}

/// Lets the browser run (paint, handle input) before continuing: a message to ourselves, which
/// queues a task like `setTimeout(0)` does, without the 4 ms minimum browsers impose on timers
/// set from timers (a load yields dozens of times).
pub async fn yield_now() {
    let p = js_sys::Promise::new(&mut |resolve, _| match web_sys::MessageChannel::new() {
        Ok(ch) => {
            ch.port1().set_onmessage(Some(&resolve));
            let _ = ch.port2().post_message(&JsValue::NULL);
        }
        Err(_) => {
            let _ = window().set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, 0);
        }
    });
    let _ = JsFuture::from(p).await;
}

/// Asks the browser for an animation frame before a long piece of work whose result will be
/// drawn in one (the timeline draws in an animation frame): when the display's next frame falls
/// within the work, the browser then runs that frame as soon as the work is over, with the
/// result, instead of waiting for the display's next frame after it (up to a frame, 16.7 ms).
pub fn frame_soon() {
    thread_local! {
        static NOOP: wasm_bindgen::closure::Closure<dyn FnMut()> =
            wasm_bindgen::closure::Closure::new(|| {});
    }
    NOOP.with(|f| {
        let _ = window().request_animation_frame(f.as_ref().unchecked_ref());
    });
}

/// Waits for the next animation frame, and then for the tasks it queued.
pub async fn next_frame() {
    let p = js_sys::Promise::new(&mut |resolve, _| {
        let _ = window().request_animation_frame(&resolve);
    });
    let _ = JsFuture::from(p).await;
    yield_now().await;
}

/// Saves `text` as a file named `name`.
pub fn download_text(name: &str, mime: &str, text: &str) -> Result<(), String> {
    let parts = js_sys::Array::of1(&JsValue::from_str(text));
    let opts = web_sys::BlobPropertyBag::new();
    opts.set_type(mime);
    let blob = web_sys::Blob::new_with_str_sequence_and_options(&parts, &opts)
        .map_err(|e| js_error(&e))?;
    let url = web_sys::Url::create_object_url_with_blob(&blob).map_err(|e| js_error(&e))?;
    let r = download_url(name, &url);
    let _ = web_sys::Url::revoke_object_url(&url);
    r
}

/// Saves what `url` points to (an object or data URL) as a file named `name`.
pub fn download_url(name: &str, url: &str) -> Result<(), String> {
    let doc = window().document().ok_or("no document")?;
    let a: web_sys::HtmlAnchorElement = doc
        .create_element("a")
        .map_err(|e| js_error(&e))?
        .unchecked_into();
    a.set_href(url);
    a.set_download(name);
    a.click();
    Ok(())
}

/// Draws a chart on a canvas, sized to `width` x `height` CSS pixels with a backing store of
/// `devicePixelRatio` device pixels per CSS pixel (sharp on HiDPI screens).
pub fn draw_canvas(
    canvas: &web_sys::HtmlCanvasElement,
    spec: &ChartSpec<'_>,
    width: u32,
    height: u32,
) -> Option<Mapper> {
    let dpr = window().device_pixel_ratio();
    let dpr = if dpr.is_finite() && dpr > 0.0 {
        dpr.min(4.0)
    } else {
        1.0
    };
    let device = |css: u32| (f64::from(css) * dpr).round() as u32;
    // Resizing clears and reallocates the canvas: only when the size changes (the chart fills
    // its background anyway).
    if canvas.width() != device(width) {
        canvas.set_width(device(width));
    }
    if canvas.height() != device(height) {
        canvas.set_height(device(height));
    }
    let css = format!("width:{width}px;height:{height}px");
    if canvas.get_attribute("style").as_deref() != Some(css.as_str()) {
        let _ = canvas.set_attribute("style", &css);
    }
    let ctx: web_sys::CanvasRenderingContext2d = canvas.get_context("2d").ok()??.dyn_into().ok()?;
    ctx.set_transform(dpr, 0.0, 0.0, dpr, 0.0, 0.0).ok()?;
    let painter = super::canvas::CanvasPainter::new(ctx, (width, height), dpr);
    let root = plotters::prelude::IntoDrawingArea::into_drawing_area(painter);
    crate::chart::draw(&root, spec).ok()
}

/// Saves a canvas as PNG.
pub fn export_png(canvas: &web_sys::HtmlCanvasElement, name: &str) -> Result<(), String> {
    let url = canvas.to_data_url().map_err(|e| js_error(&e))?;
    download_url(name, &url)
}

/// CSS pixels from the top of `el` to the bottom of the window (what a frame has left for it).
pub fn height_below(el: &web_sys::Element) -> u32 {
    let inner = window()
        .inner_height()
        .ok()
        .and_then(|h| h.as_f64())
        .unwrap_or(0.0);
    let top = el.get_bounding_client_rect().top() + window().scroll_y().unwrap_or(0.0);
    (inner - top).max(0.0).floor() as u32
}

/// Width available to a canvas (its parent's width), with a floor.
pub fn available_width(canvas: &web_sys::HtmlCanvasElement) -> u32 {
    canvas
        .parent_element()
        .map_or(900, |p| p.client_width())
        .max(320) as u32
}
