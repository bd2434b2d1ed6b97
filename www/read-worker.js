// Reads files for the viewer off the page's main thread: the browser hands a file's bytes over
// on the thread that asked for them, so bytes read here arrive while the page is busy decoding
// (viewer/src/app/load.rs, read_worker.rs). Messages from the page:
//   {id, blob, stream: true}  read the whole file as a stream: answered by {id, bufs} batches of
//                             the stream's own chunks, transferred, not copied (the first batch
//                             is one buffer of at least FIRST_BATCH bytes, or the whole file),
//                             then {id, done: true}, or {id, error}
//   {id, ack: n}              the page has taken n more bytes of stream id: at most
//                             MAX_UNTAKEN bytes are sent and not yet taken, so a file the page
//                             decodes slower than it is read does not pile up in its memory
//   {id, cancel: true}        stop reading stream id
// {ready: true} says the worker runs: until then (or where it never runs, as in a page opened
// from disk) the page reads the file itself.

// A batch is sent once it holds this many bytes: small at first, so decoding starts within a
// few milliseconds of the file being chosen, doubling up to the largest (fewer messages).
const FIRST_BATCH = 64 * 1024;
const MAX_BATCH = 4 * 1024 * 1024;
const MAX_UNTAKEN = 32 * 1024 * 1024;

// Streams being read, by id: {untaken, wake, cancelled}.
const streams = new Map();

async function stream(id, blob) {
  const s = { untaken: 0, wake: null, cancelled: false };
  streams.set(id, s);
  const reader = blob.stream().getReader();
  let parts = [];
  let have = 0;
  let want = FIRST_BATCH;
  let first = true;
  const send = async () => {
    let bufs;
    if (first) {
      // One buffer, so the page can tell the file's format from its first bytes.
      const one = new Uint8Array(have);
      let at = 0;
      for (const p of parts) {
        one.set(p, at);
        at += p.byteLength;
      }
      bufs = [one.buffer];
      first = false;
    } else {
      // A chunk that is a view of part of a larger buffer is copied (transferring the buffer
      // would hand over bytes that are not the chunk's).
      bufs = parts.map((p) => (p.byteOffset === 0 && p.byteLength === p.buffer.byteLength ? p.buffer : p.slice().buffer));
    }
    while (s.untaken >= MAX_UNTAKEN && !s.cancelled) {
      await new Promise((res) => { s.wake = res; });
    }
    if (s.cancelled) return;
    s.untaken += have;
    postMessage({ id, bufs }, bufs);
    parts = [];
    have = 0;
    want = Math.min(want * 2, MAX_BATCH);
  };
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (s.cancelled) {
        reader.cancel().catch(() => {});
        return;
      }
      if (done) break;
      parts.push(value);
      have += value.byteLength;
      if (have >= want) await send();
    }
    if (have && !s.cancelled) await send();
    if (!s.cancelled) postMessage({ id, done: true });
  } catch (e) {
    if (!s.cancelled) postMessage({ id, error: String(e) });
  } finally {
    streams.delete(id);
  }
}

onmessage = ({ data }) => {
  const { id } = data;
  if (data.stream) {
    stream(id, data.blob);
    return;
  }
  if (data.ack !== undefined || data.cancel) {
    const s = streams.get(id);
    if (!s) return;
    if (data.cancel) s.cancelled = true;
    else s.untaken -= data.ack;
    if (s.wake) {
      s.wake();
      s.wake = null;
    }
  }
};
postMessage({ ready: true });
