// Summarizes scripts/bench-vs-pytorch.sh's JSON lines: per file, PyTorch's viewer and each build
// of ours, the median, min and max time from
// choosing the file to the painted frame that shows the first timeline, the memory, and PyTorch's
// median time over ours. Usage: node vs-pytorch-summary.mjs results.jsonl
import fs from 'node:fs';

const rows = fs.readFileSync(process.argv[2], 'utf8').split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };
const stat = (xs) => {
  const ok = xs.filter((x) => Number.isFinite(x));
  return ok.length ? { median: +median(ok).toFixed(1), min: Math.min(...ok), max: Math.max(...ok) } : null;
};
const groups = new Map();
for (const r of rows) {
  const who = r.viewer === 'pytorch-memoryviz' ? 'pytorch' : r.build;
  const key = `${r.input}\t${who}`;
  if (!groups.has(key)) groups.set(key, []);
  groups.get(key).push(r);
}
const pytorch = new Map();
for (const [key, rs] of groups) {
  const [input, who] = key.split('\t');
  if (who === 'pytorch') pytorch.set(input, stat(rs.map((r) => r.first_timeline_ms))?.median);
}
for (const [key, rs] of groups) {
  const [input, who] = key.split('\t');
  const painted = stat(rs.map((r) => (who === 'pytorch' ? r.first_timeline_ms : r.first_painted_ms)));
  const out = { summary: input, viewer: who, runs: rs.length, first_painted_ms: painted };
  if (who === 'pytorch') {
    out.failed = rs.filter((r) => r.status !== 'ok').map((r) => r.status);
    out.idle_js_heap_mib = stat(rs.map((r) => r.idle_js_heap_mib));
    out.js_heap_max_mib = stat(rs.map((r) => r.js_heap_max_mib));
  } else {
    out.first_timeline_ms = stat(rs.map((r) => r.first_timeline_ms));
    out.idle_wasm_memory_mib = stat(rs.map((r) => r.idle_wasm_memory_mib));
    out.idle_js_heap_mib = stat(rs.map((r) => r.idle_js_heap_mib));
    out.wasm_memory_mib = stat(rs.map((r) => r.wasm_memory_mib));
    out.js_heap_max_mib = stat(rs.map((r) => r.js_heap_max_mib));
    const theirs = pytorch.get(input);
    if (theirs && painted) out.pytorch_over_ours = +(theirs / painted.median).toFixed(1);
  }
  console.log(JSON.stringify(out));
}
