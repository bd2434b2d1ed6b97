// Reads slices of a file for the viewer off the page's main thread: the browser hands a file's
// bytes over on the thread that asked for them, so slices read here arrive while the page is
// busy decoding the previous one (viewer/src/app/load.rs). Each message {id, blob, start, end}
// gets {id, buf} (the buffer is transferred, not copied) or {id, error}. {ready: true} says the
// worker runs: until then (or where it never runs, as in a page opened from disk) the page reads
// slices itself.
onmessage = async ({ data: { id, blob, start, end } }) => {
  try {
    const buf = await blob.slice(start, end).arrayBuffer();
    postMessage({ id, buf }, [buf]);
  } catch (e) {
    postMessage({ id, error: String(e) });
  }
};
postMessage({ ready: true });
