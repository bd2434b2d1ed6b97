//! Slices of a file read by a worker (`www/read-worker.js`). The browser hands a file's bytes
//! over on the thread that asked for them, in tasks of that thread: asked from the page, the next
//! slice only arrives in the gaps between the tasks that decode the current one, so reading and
//! decoding take turns. Asked from a worker, the slice is read while the page decodes, and the
//! worker transfers the buffer (no copy).
//!
//! Where no worker can run (the single-file report of `gpucollect html` opened from disk, a
//! browser without workers), [`read`] answers `None`, or its promise fails, and the caller reads
//! on the page's thread instead.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

/// Resolve and reject functions of the promises waiting for the worker, by request id.
type Waiting = Rc<RefCell<HashMap<u32, (js_sys::Function, js_sys::Function)>>>;

struct Reader {
    worker: web_sys::Worker,
    /// The worker said it runs (a worker whose script cannot load may fail silently).
    ready: Rc<Cell<bool>>,
    waiting: Waiting,
    next_id: u32,
    _on_message: Closure<dyn FnMut(web_sys::MessageEvent)>,
    _on_error: Closure<dyn FnMut(web_sys::Event)>,
}

thread_local! {
    static READER: RefCell<Option<Reader>> = const { RefCell::new(None) };
    /// Set once the worker could not be started or failed: reads stay on the page's thread.
    static UNAVAILABLE: Rc<Cell<bool>> = Rc::new(Cell::new(false));
}

/// Fails every waiting promise (the worker is gone).
fn fail_all(waiting: &Waiting, why: &str) {
    for (_, (_, reject)) in waiting.borrow_mut().drain() {
        let _ = reject.call1(&JsValue::NULL, &JsValue::from_str(why));
    }
}

fn start_worker() -> Option<Reader> {
    let worker = web_sys::Worker::new("read-worker.js").ok()?;
    let waiting: Waiting = Rc::default();
    let ready = Rc::new(Cell::new(false));
    let (w, r) = (waiting.clone(), ready.clone());
    let on_message =
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
            let data = e.data();
            if js_sys::Reflect::get(&data, &"ready".into()).is_ok_and(|v| v.is_truthy()) {
                r.set(true);
                return;
            }
            let id = js_sys::Reflect::get(&data, &"id".into())
                .ok()
                .and_then(|v| v.as_f64())
                .map_or(u32::MAX, |v| v as u32);
            let Some((resolve, reject)) = w.borrow_mut().remove(&id) else {
                return;
            };
            match js_sys::Reflect::get(&data, &"buf".into()) {
                Ok(buf) if buf.is_instance_of::<js_sys::ArrayBuffer>() => {
                    let _ = resolve.call1(&JsValue::NULL, &buf);
                }
                _ => {
                    let why = js_sys::Reflect::get(&data, &"error".into()).unwrap_or_else(|_| {
                        JsValue::from_str("the worker could not read the file")
                    });
                    let _ = reject.call1(&JsValue::NULL, &why);
                }
            }
        });
    let w = waiting.clone();
    let unavailable = UNAVAILABLE.with(Rc::clone);
    // The script could not be loaded or failed: nothing more goes to this worker.
    let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(move |_: web_sys::Event| {
        unavailable.set(true);
        fail_all(&w, "the file-reading worker is not available");
    });
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    Some(Reader {
        worker,
        ready,
        waiting,
        next_id: 0,
        _on_message: on_message,
        _on_error: on_error,
    })
}

/// Runs `f` on the worker, started first if it does not run yet; `None` where no worker can
/// run (remembered: later calls do not try again).
fn with_worker<T>(f: impl FnOnce(&mut Reader) -> Option<T>) -> Option<T> {
    if UNAVAILABLE.with(|u| u.get()) {
        return None;
    }
    READER.with(|r| {
        let mut r = r.try_borrow_mut().ok()?;
        if r.is_none() {
            *r = start_worker();
        }
        let Some(reader) = r.as_mut() else {
            UNAVAILABLE.with(|u| u.set(true));
            return None;
        };
        f(reader)
    })
}

/// Starts the worker now (its script loads while the page waits for a file), unless it runs.
pub fn prepare() {
    with_worker(|_| Some(()));
}

/// A promise of bytes `[start, end)` of `blob` (an `ArrayBuffer`), read by the worker; `None`
/// when no worker can read them, or it has not said it runs yet (read them on this thread).
pub fn read(blob: &web_sys::Blob, start: f64, end: f64) -> Option<js_sys::Promise> {
    with_worker(|reader| {
        if !reader.ready.get() {
            return None;
        }
        let id = reader.next_id;
        reader.next_id = reader.next_id.wrapping_add(1);
        let msg = js_sys::Object::new();
        for (k, v) in [
            ("id", JsValue::from(id)),
            ("blob", JsValue::from(blob.clone())),
            ("start", JsValue::from(start)),
            ("end", JsValue::from(end)),
        ] {
            js_sys::Reflect::set(&msg, &k.into(), &v).ok()?;
        }
        let waiting = reader.waiting.clone();
        let promise = js_sys::Promise::new(&mut |resolve, reject| {
            waiting.borrow_mut().insert(id, (resolve, reject));
        });
        if reader.worker.post_message(&msg).is_err() {
            waiting.borrow_mut().remove(&id);
            return None;
        }
        Some(promise)
    })
}

/// Stops using the worker (its read failed): later reads happen on this thread.
pub fn give_up() {
    UNAVAILABLE.with(|u| u.set(true));
    READER.with(|r| {
        let Ok(mut r) = r.try_borrow_mut() else {
            return;
        };
        if let Some(reader) = r.take() {
            reader.worker.terminate();
            fail_all(&reader.waiting, "the file-reading worker stopped");
        }
    });
}
