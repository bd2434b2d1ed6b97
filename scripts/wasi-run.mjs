// Runs a wasm32-wasip1 program under Node's WASI: node scripts/wasi-run.mjs FILE.wasm [ARGS...]
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv, exit } from 'node:process';

const [file, ...args] = argv.slice(2);
if (!file) {
  console.error('usage: node scripts/wasi-run.mjs FILE.wasm [ARGS...]');
  exit(2);
}
// Files under /tmp and the current directory are readable (for benchmarks that take a file).
const wasi = new WASI({
  version: 'preview1',
  args: [file, ...args],
  env: {},
  preopens: { '/tmp': '/tmp', '.': process.cwd() },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(file));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
