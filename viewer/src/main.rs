//! Entry point: installs the panic hook and mounts the app (see `lib.rs`).

#[cfg(target_arch = "wasm32")]
fn main() {
    console_error_panic_hook::set_once();
    leptos::mount::mount_to_body(viewer::app::App);
}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    eprintln!(
        "the gpucollect viewer runs in the browser: build it with `trunk build --offline` and \
         open dist/index.html through a web server (see viewer/README.md)"
    );
}
