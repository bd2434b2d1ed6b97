// Summarizes the benchmark's JSON lines (scripts/bench-browser.sh with ROUNDS or several DIST
// folders): per input and build, the median, min and max time to the first timeline, of each
// load phase and of the zoom steps' draws, and the zoom steps' frames missed, over the rounds. Usage: node bench-summary.mjs results.jsonl
import fs from 'node:fs';

const rows = fs.readFileSync(process.argv[2], 'utf8').split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };
const groups = new Map();
for (const r of rows) {
  const key = `${r.input ?? r.events}\t${r.build ?? ''}`;
  if (!groups.has(key)) groups.set(key, []);
  groups.get(key).push(r);
}
for (const [key, rs] of groups) {
  const [input, build] = key.split('\t');
  const stat = (xs) => ({ median: median(xs), min: Math.min(...xs), max: Math.max(...xs) });
  // Phases as durations: reading (and parsing, for snapshots), decoding or converting, tables.
  const phase = (r, from, to) => (r.phases_ms[to] ?? NaN) - (from ? r.phases_ms[from] ?? NaN : 0);
  console.log(JSON.stringify({
    summary: input,
    build: build || undefined,
    runs: rs.length,
    first_timeline_ms: stat(rs.map((r) => r.first_timeline_ms)),
    first_painted_ms: stat(rs.map((r) => r.first_painted_ms)),
    read_ms: stat(rs.map((r) => phase(r, null, 'read'))),
    decode_or_convert_ms: stat(rs.map((r) => phase(r, 'read', 'decoded'))),
    tables_ms: stat(rs.map((r) => phase(r, 'decoded', 'tables'))),
    wasm_memory_mib: stat(rs.map((r) => r.wasm_memory_mib)),
    // Zoom steps (rows from before the frames were recorded have none of these).
    zoom_draw_ms_median: stat(rs.map((r) => r.zoom_draw_ms_median)),
    zoom_draw_ms_max: stat(rs.map((r) => r.zoom_draw_ms_max ?? NaN)),
    zoom_frames_missed: rs.reduce((n, r) => n + (r.zoom_frames_missed ?? NaN), 0),
  }));
}
