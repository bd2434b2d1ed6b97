//! Files read by a worker (`www/read-worker.js`). The browser hands a file's bytes over on the
//! thread that asked for them, in tasks of that thread: asked from the page, bytes only arrive in
//! the gaps between the tasks that decode them, so reading and decoding take turns. The worker
//! reads the file as a stream while the page decodes, and transfers it in batches (no copy): the
//! first batch a few milliseconds after the file is chosen, the next ones as they come. The page
//! acknowledges each batch it takes, and the worker stops reading while too many bytes are
//! untaken, so a file read faster than it is decoded does not pile up in the page's memory.
//! Where the worker reads into buffers of its own (a BYOB reader), the page hands each buffer
//! back once it has copied its bytes ([`Stream::give_back`]), and the worker reads into it
//! again: the file's bytes pass through a few MiB of buffers, not through new memory.
//!
//! Where no worker can run (the single-file report of `gpucollect html` opened from disk, a
//! browser without workers), [`stream`] answers `None`, or the stream fails, and the caller reads
//! on the page's thread instead.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

/// A batch of the file's bytes, in file order, as the worker sent it.
pub struct Batch {
    /// Views of the bytes (the worker sends `ArrayBuffer`s or `Uint8Array`s).
    pub pieces: Vec<js_sys::Uint8Array>,
    /// The worker reads into these buffers again once they are handed back.
    pub reuse: bool,
}

/// What the worker sent for one stream and the page has not taken yet.
#[derive(Default)]
struct Inbox {
    /// In order: a batch, the end (`None`), or an error.
    messages: VecDeque<Result<Option<Batch>, JsValue>>,
    /// Resolves the promise [`Stream::next`] waits on while there is nothing to take.
    wake: Option<js_sys::Function>,
}

impl Inbox {
    fn put(&mut self, message: Result<Option<Batch>, JsValue>) {
        self.messages.push_back(message);
        if let Some(wake) = self.wake.take() {
            let _ = wake.call0(&JsValue::NULL);
        }
    }
}

/// Inboxes of the streams being read, by stream id.
type Inboxes = Rc<RefCell<HashMap<u32, Rc<RefCell<Inbox>>>>>;

struct Reader {
    worker: web_sys::Worker,
    /// The worker said it runs (a worker whose script cannot load may fail silently).
    ready: Rc<Cell<bool>>,
    inboxes: Inboxes,
    next_id: u32,
    _on_message: Closure<dyn FnMut(web_sys::MessageEvent)>,
    _on_error: Closure<dyn FnMut(web_sys::Event)>,
}

thread_local! {
    static READER: RefCell<Option<Reader>> = const { RefCell::new(None) };
    /// Set once the worker could not be started or failed: reads stay on the page's thread.
    static UNAVAILABLE: Rc<Cell<bool>> = Rc::new(Cell::new(false));
}

/// Ends every stream with an error (the worker is gone).
fn fail_all(inboxes: &Inboxes, why: &str) {
    for (_, inbox) in inboxes.borrow_mut().drain() {
        inbox.borrow_mut().put(Err(JsValue::from_str(why)));
    }
}

fn start_worker() -> Option<Reader> {
    let worker = web_sys::Worker::new("read-worker.js").ok()?;
    let inboxes: Inboxes = Rc::default();
    let ready = Rc::new(Cell::new(false));
    let (boxes, r) = (inboxes.clone(), ready.clone());
    let on_message =
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
            let data = e.data();
            let get = |k: &str| js_sys::Reflect::get(&data, &k.into()).ok();
            if get("ready").is_some_and(|v| v.is_truthy()) {
                r.set(true);
                // From now on a chosen file is streamed by the worker (the browser tests wait
                // for this mark before choosing one).
                super::dom::mark("gpucollect:read-worker-ready");
                return;
            }
            let id = get("id")
                .and_then(|v| v.as_f64())
                .map_or(u32::MAX, |v| v as u32);
            let Some(inbox) = boxes.borrow().get(&id).cloned() else {
                return;
            };
            let message = match get("bufs") {
                Some(bufs) if bufs.is_instance_of::<js_sys::Array>() => Ok(Some(Batch {
                    pieces: js_sys::Array::from(&bufs)
                        .iter()
                        .map(|b| match b.dyn_into::<js_sys::Uint8Array>() {
                            Ok(view) => view,
                            Err(buf) => js_sys::Uint8Array::new(&buf),
                        })
                        .collect(),
                    reuse: get("reuse").is_some_and(|v| v.is_truthy()),
                })),
                _ if get("done").is_some_and(|v| v.is_truthy()) => Ok(None),
                _ => Err(get("error")
                    .filter(|v| !v.is_undefined())
                    .unwrap_or_else(|| JsValue::from_str("the worker could not read the file"))),
            };
            inbox.borrow_mut().put(message);
        });
    let boxes = inboxes.clone();
    let unavailable = UNAVAILABLE.with(Rc::clone);
    // The script could not be loaded or failed: nothing more goes to this worker.
    let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(move |_: web_sys::Event| {
        unavailable.set(true);
        fail_all(&boxes, "the file-reading worker is not available");
    });
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    Some(Reader {
        worker,
        ready,
        inboxes,
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

/// Starts the worker now, unless it runs: its script loads while the page waits for a file, and
/// it reads nothing (and holds no buffers) until one is chosen.
pub fn prepare() {
    with_worker(|_| Some(()));
}

/// Sends `{id, key: value}` to the worker, if it runs, transferring `transfer` (if given).
fn tell(id: u32, key: &str, value: JsValue, transfer: Option<&JsValue>) {
    READER.with(|r| {
        let Ok(r) = r.try_borrow() else { return };
        let Some(reader) = r.as_ref() else { return };
        let msg = js_sys::Object::new();
        if js_sys::Reflect::set(&msg, &"id".into(), &JsValue::from(id)).is_ok()
            && js_sys::Reflect::set(&msg, &key.into(), &value).is_ok()
        {
            let _ = match transfer {
                Some(t) => reader
                    .worker
                    .post_message_with_transfer(&msg, &js_sys::Array::of1(t)),
                None => reader.worker.post_message(&msg),
            };
        }
    });
}

/// A file being read by the worker, from its start.
pub struct Stream {
    id: u32,
    inbox: Rc<RefCell<Inbox>>,
}

/// Starts reading `blob` in the worker; `None` when no worker can read it, or it has not said it
/// runs yet (read it on this thread).
pub fn stream(blob: &web_sys::Blob) -> Option<Stream> {
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
            ("stream", JsValue::TRUE),
        ] {
            js_sys::Reflect::set(&msg, &k.into(), &v).ok()?;
        }
        let inbox = Rc::new(RefCell::new(Inbox::default()));
        reader.inboxes.borrow_mut().insert(id, inbox.clone());
        if reader.worker.post_message(&msg).is_err() {
            reader.inboxes.borrow_mut().remove(&id);
            return None;
        }
        Some(Stream { id, inbox })
    })
}

impl Stream {
    /// The next batch of the file's bytes, `None` at its end.
    pub async fn next(&self) -> Result<Option<Batch>, JsValue> {
        loop {
            let message = self.inbox.borrow_mut().messages.pop_front();
            match message {
                Some(Ok(Some(batch))) => {
                    let bytes: f64 = batch.pieces.iter().map(|b| f64::from(b.length())).sum();
                    tell(self.id, "ack", JsValue::from(bytes), None);
                    return Ok(Some(batch));
                }
                Some(other) => return other,
                None => {}
            }
            let inbox = self.inbox.clone();
            let wait = js_sys::Promise::new(&mut |resolve, _| {
                inbox.borrow_mut().wake = Some(resolve);
            });
            let _ = JsFuture::from(wait).await;
        }
    }

    /// Hands the buffer of `piece` (from a batch with `reuse`) back to the worker, to be read
    /// into again; `piece` is empty (detached) afterwards.
    pub fn give_back(&self, piece: &js_sys::Uint8Array) {
        let buf = JsValue::from(piece.buffer());
        tell(self.id, "back", buf.clone(), Some(&buf));
    }
}

impl Drop for Stream {
    /// The worker stops reading (a newer load started, or this one ended or failed).
    fn drop(&mut self) {
        tell(self.id, "cancel", JsValue::TRUE, None);
        READER.with(|r| {
            if let Ok(r) = r.try_borrow()
                && let Some(reader) = r.as_ref()
            {
                reader.inboxes.borrow_mut().remove(&self.id);
            }
        });
    }
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
            fail_all(&reader.inboxes, "the file-reading worker stopped");
        }
    });
}
