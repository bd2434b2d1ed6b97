// Reads files for the viewer off the page's main thread: the browser hands a file's bytes over
// on the thread that asked for them, so bytes read here arrive while the page is busy decoding
// (viewer/src/app/load.rs, read_worker.rs). Messages from the page:
//   {id, blob, stream: true}  read the whole file as a stream: answered by {id, bufs, reuse}
//                             batches (each an array of ArrayBuffers or Uint8Arrays,
//                             transferred, not copied; the first batch is one buffer of at
//                             least FIRST_BATCH bytes, or the whole file; `reuse`: hand the
//                             buffers back), then {id, done: true}, or {id, error}
//   {id, ack: n}              the page has taken n more bytes of stream id: at most
//                             MAX_UNTAKEN bytes are sent and not yet taken, so a file the page
//                             decodes slower than it is read does not pile up in its memory
//   {id, back: buffer}        the page has copied a buffer's bytes and hands the buffer back,
//                             to be read into again (transferred)
//   {id, cancel: true}        stop reading stream id
// {ready: true} says the worker runs: until then (or where it never runs, as in a page opened
// from disk) the page reads the file itself.
//
// Where the browser's file streams are byte streams (a BYOB reader), the file is read straight
// into buffers of the batch's size, and the buffers the page hands back are read into again: a
// large file then passes through the same few MiB instead of hundreds of MiB of new buffers,
// each of whose pages the kernel would first have to hand out (about as costly as reading
// them), and which the page's garbage collector would then have to free. The buffers are kept
// for the next file (up to SPARE_BYTES); none is made before a file is chosen. Elsewhere the
// stream's own chunks are sent in batches.

// A batch is sent once it holds this many bytes: small at first, so decoding starts within a
// few milliseconds of the file being chosen, doubling up to the largest (fewer messages).
const FIRST_BATCH = 64 * 1024;
const MAX_BATCH = 4 * 1024 * 1024;
const MAX_UNTAKEN = 32 * 1024 * 1024;

// Buffers kept between streams, at most this many bytes of them.
const SPARE_BYTES = 24 * 1024 * 1024;

// Streams being read, by id: {untaken, wake, cancelled}.
const streams = new Map();

// Buffers to read into: handed back by the page, or kept from earlier streams.
const spare = [];

// Buffers made and buffers read into again, over every stream (the browser tests read them).
const stats = { buffers: 0, reused: 0 };
self.stats = stats;

// Keeps a buffer to read into again, within SPARE_BYTES.
function keep(buf) {
  const held = spare.reduce((sum, b) => sum + b.byteLength, 0);
  if (held + buf.byteLength <= SPARE_BYTES) spare.push(buf);
}

// Waits while too many bytes are sent and untaken; false once the stream is cancelled.
async function room(s) {
  while (s.untaken >= MAX_UNTAKEN && !s.cancelled) {
    await new Promise((res) => { s.wake = res; });
  }
  return !s.cancelled;
}

async function stream(id, blob) {
  const s = { untaken: 0, wake: null, cancelled: false };
  streams.set(id, s);
  try {
    let byob = null;
    try {
      byob = blob.stream().getReader({ mode: 'byob' });
    } catch {
      // Not a byte stream here: its chunks are sent as they come.
    }
    if (byob) await intoBuffers(id, blob.size, byob, s);
    else await inChunks(id, blob, s);
    if (!s.cancelled) postMessage({ id, done: true });
  } catch (e) {
    if (!s.cancelled) postMessage({ id, error: String(e) });
  } finally {
    streams.delete(id);
  }
}

// The smallest spare buffer that holds at least n bytes, or a new one.
function buffer(n) {
  let best = -1;
  for (let i = 0; i < spare.length; i++) {
    if (spare[i].byteLength >= n && (best < 0 || spare[i].byteLength < spare[best].byteLength)) best = i;
  }
  if (best < 0) {
    stats.buffers++;
    return new ArrayBuffer(n);
  }
  stats.reused++;
  return spare.splice(best, 1)[0];
}

// Reads `size` bytes with a BYOB reader, each batch into one buffer (FIRST_BATCH, doubling up to
// MAX_BATCH), filled before it is sent as a Uint8Array of the bytes read.
async function intoBuffers(id, size, reader, s) {
  let at = 0;
  let want = FIRST_BATCH;
  let ended = false;
  while (at < size && !ended) {
    const n = Math.min(want, size - at);
    let buf = buffer(n);
    let got = 0;
    while (got < n) {
      // `min`: resolved once the view is full, not at each of the stream's own chunks (browsers
      // without it resolve earlier, and this reads again).
      const { done, value } = await reader.read(new Uint8Array(buf, got, n - got), { min: n - got });
      if (value) {
        buf = value.buffer;
        got += value.byteLength;
      }
      if (done) {
        ended = true;
        break;
      }
    }
    if (s.cancelled || !(await room(s))) {
      reader.cancel().catch(() => {});
      return;
    }
    if (got) {
      s.untaken += got;
      postMessage({ id, bufs: [new Uint8Array(buf, 0, got)], reuse: true }, [buf]);
    }
    at += got;
    want = Math.min(want * 2, MAX_BATCH);
  }
}

// Reads the stream's own chunks and sends them in batches.
async function inChunks(id, blob, s) {
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
    if (!(await room(s))) return;
    s.untaken += have;
    postMessage({ id, bufs }, bufs);
    parts = [];
    have = 0;
    want = Math.min(want * 2, MAX_BATCH);
  };
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
}

onmessage = ({ data }) => {
  const { id } = data;
  if (data.stream) {
    stream(id, data.blob);
    return;
  }
  if (data.back) {
    keep(data.back);
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
