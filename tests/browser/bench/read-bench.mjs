// Benchmark helper (not a test): how fast headless Chromium hands over a chosen file's bytes, by
// way of reading. Serves its own page, chooses FILE in it and times each MODE, ROUNDS times:
//   whole         file.arrayBuffer() on the page
//   whole-worker  one slice of the whole file, read by a worker (transferred)
//   stream        file.stream() on the page
//   w:A:F:M       slices read by a worker, A requested ahead, the first F MiB, each next one
//                 doubled up to M MiB (the viewer until 2026-11-24: w:2:1:8)
//   ws:F:M        file.stream() read by a worker, its chunks gathered into pieces of at least
//                 F KiB, each next one doubled up to M KiB, each transferred as it fills
//   wb:F:M        the same, but the stream's chunks are transferred as they are, in batches
//                 (no copy in the worker)
//   byob:F:M      file.stream() read by a worker with a BYOB reader into buffers of F KiB,
//                 each next one doubled up to M KiB, each filled (read with `min`) and
//                 transferred
//   frs:F:M       slices read one after another by a worker with FileReaderSync (no promise
//                 per stream chunk), the first F KiB, each next one doubled up to M KiB, each
//                 transferred as it is read
// RATE (bytes per ms, default 0): after each piece, the page is kept busy for its size / RATE,
// as a parser of that speed would keep it, to see how reading overlaps with work.
// Prints one JSON line per run: ms (until the last byte, and the work on it), first (ms until
// the first bytes), chunks (pieces a stream gave). Env: FILE, MODES, ROUNDS (default 3), RATE.
import http from 'node:http';
import { launch } from '../lib.mjs';

const PAGE = `<!doctype html><html><body><input type=file id=f><script>
const w = new Worker('w.js');
let id = 0; const waiting = new Map();
w.onmessage = ({ data }) => { const r = waiting.get(data.id); if (data.more) { r(data); return; } waiting.delete(data.id); r(data.buf); };
const wread = (blob, s, e) => new Promise((res) => { const i = id++; waiting.set(i, res); w.postMessage({ id: i, blob, start: s, end: e }); });
const busy = (n, rate) => { if (!rate) return; const until = performance.now() + n / rate; while (performance.now() < until); };
window.run = async (mode, rate) => {
  const file = document.getElementById('f').files[0];
  const t0 = performance.now(); let first = null; let total = 0; let chunks = 0;
  const got = (n) => { if (first === null) first = performance.now() - t0; total += n; chunks++; busy(n, rate); };
  if (mode === 'whole') got((await file.arrayBuffer()).byteLength);
  else if (mode === 'whole-worker') got((await wread(file, 0, file.size)).byteLength);
  else if (mode === 'stream') { const r = file.stream().getReader(); for (;;) { const { done, value } = await r.read(); if (done) break; got(value.byteLength); } }
  else if (mode.startsWith('ws:') || mode.startsWith('wb:') || mode.startsWith('frs:') || mode.startsWith('byob:')) {
    const batch = mode.startsWith('wb:');
    const sync = mode.startsWith('frs:');
    const byob = mode.startsWith('byob:');
    const [, firstKiB, maxKiB] = mode.split(':').map(Number);
    const q = []; let wake = null; const i = id++;
    waiting.set(i, (d) => { q.push(d); if (wake) { wake(); wake = null; } });
    w.postMessage({ id: i, blob: file, stream: true, batch, sync, byob, first: firstKiB * 1024, max: maxKiB * 1024 });
    for (;;) {
      if (!q.length) await new Promise((res) => { wake = res; });
      const d = q.shift();
      if (d.done) { waiting.delete(i); break; }
      if (d.bufs) for (const b of d.bufs) got(b.byteLength); else got(d.buf.byteLength);
    }
  } else {
    const [, ahead, firstMiB, maxMiB] = mode.split(':').map(Number);
    let off = 0; let size = firstMiB * 1048576; const q = [];
    const fill = () => { while (q.length < ahead && off < file.size) { const e = Math.min(off + size, file.size); q.push(wread(file, off, e)); off = e; size = Math.min(size * 2, maxMiB * 1048576); } };
    fill();
    while (q.length) { const b = await q.shift(); fill(); got(b.byteLength); }
  }
  return { mode, ms: Math.round(performance.now() - t0), first: Math.round(first), total, chunks };
};
</script></body></html>`;
const WORKER = `onmessage = async ({ data: { id, blob, start, end, stream, batch, sync, byob, first, max } }) => {
  if (byob) {
    const r = blob.stream().getReader({ mode: 'byob' }); let off = 0; let want = first;
    while (off < blob.size) { const n = Math.min(want, blob.size - off); let view = new Uint8Array(new ArrayBuffer(n)); let got = 0;
      while (got < n) { const { done, value } = await r.read(new Uint8Array(view.buffer, got, n - got), { min: n - got }); if (done) break; got += value.byteLength; view = new Uint8Array(value.buffer); }
      postMessage({ id, more: true, buf: view.buffer }, [view.buffer]); off += n; want = Math.min(want * 2, max); }
    postMessage({ id, more: true, done: true }); return;
  }
  if (sync) {
    const r = new FileReaderSync(); let off = 0; let want = first;
    while (off < blob.size) { const e = Math.min(off + want, blob.size); const buf = r.readAsArrayBuffer(blob.slice(off, e));
      postMessage({ id, more: true, buf }, [buf]); off = e; want = Math.min(want * 2, max); }
    postMessage({ id, more: true, done: true }); return;
  }
  if (stream) {
    const r = blob.stream().getReader(); let want = first; let parts = []; let have = 0;
    const send = () => { if (batch) { const bufs = parts.map((p) => p.byteOffset === 0 && p.byteLength === p.buffer.byteLength ? p.buffer : p.slice().buffer);
      postMessage({ id, more: true, bufs }, bufs); parts = []; have = 0; want = Math.min(want * 2, max); return; } const buf = new Uint8Array(have); let o = 0; for (const p of parts) { buf.set(p, o); o += p.byteLength; }
      postMessage({ id, more: true, buf: buf.buffer }, [buf.buffer]); parts = []; have = 0; want = Math.min(want * 2, max); };
    for (;;) { const { done, value } = await r.read(); if (done) break; parts.push(value); have += value.byteLength; if (have >= want) send(); }
    if (have) send();
    postMessage({ id, more: true, done: true }); return;
  }
  const buf = await blob.slice(start, end).arrayBuffer(); postMessage({ id, buf }, [buf]); };`;

const server = http.createServer((req, res) => {
  const worker = req.url === '/w.js';
  res.writeHead(200, { 'content-type': worker ? 'text/javascript' : 'text/html' });
  res.end(worker ? WORKER : PAGE);
});
await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
const { ctx, close } = await launch();
const page = await ctx.newPage();
await page.goto(`http://127.0.0.1:${server.address().port}/`);
const modes = (process.env.MODES || 'whole whole-worker stream w:2:1:8 w:4:4:16').split(/\s+/);
const rate = Number(process.env.RATE || 0);
for (let round = 0; round < Number(process.env.ROUNDS || 3); round++) {
  for (const mode of modes) {
    await page.setInputFiles('#f', process.env.FILE);
    console.log(JSON.stringify({ round, rate, ...(await page.evaluate(([m, r]) => window.run(m, r), [mode, rate])) }));
  }
}
await close();
server.close();
