// Tiny static server for the built viewer: `node server.mjs ROOT [PORT] [TRACES_DIR]`.
// Serves ROOT at / and TRACES_DIR (if given) at /traces/. Prints the URL when ready. Every
// answer allows reads from any origin (CORS), as a file host that shares traces does: the
// cross-origin `?trace=` tests open these traces from another server's page.
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';

const [rootArg, port = '0', tracesArg] = process.argv.slice(2);
const root = rootArg && path.resolve(rootArg);
const traces = tracesArg && path.resolve(tracesArg);
if (!rootArg) {
  console.error('usage: node server.mjs ROOT [PORT] [TRACES_DIR]');
  process.exit(2);
}
const types = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.mjs': 'text/javascript',
  '.wasm': 'application/wasm', '.css': 'text/css', '.json': 'application/json',
  '.svg': 'image/svg+xml', '.png': 'image/png',
};
const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://localhost');
  let p = decodeURIComponent(url.pathname);
  let base = root;
  if (traces && p.startsWith('/traces/')) {
    base = traces;
    p = p.slice('/traces'.length);
  }
  if (p.endsWith('/')) p += 'index.html';
  const file = path.join(base, path.normalize(p));
  if (!file.startsWith(base)) {
    res.writeHead(403).end();
    return;
  }
  fs.stat(file, (err, st) => {
    if (err || !st.isFile()) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
      return;
    }
    res.writeHead(200, {
      'content-type': types[path.extname(file)] || 'application/octet-stream',
      'content-length': st.size,
      'cache-control': 'no-store',
      'access-control-allow-origin': '*',
    });
    fs.createReadStream(file).pipe(res);
  });
});
server.listen(Number(port), '127.0.0.1', () => {
  console.log(`http://127.0.0.1:${server.address().port}/`);
});
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => server.close(() => process.exit(0)));
