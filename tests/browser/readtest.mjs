import { launch } from './lib.mjs';
const { ctx, close } = await launch();
const page = await ctx.newPage();
await page.goto(process.env.BASE_URL + 'index.html');
const modes = (process.env.MODES || 'whole whole-worker stream w:2:1:8 w:4:1:8 w:2:4:16 w:3:2:8').split(' ');
for (let round = 0; round < 3; round++) for (const m of modes) {
  await page.setInputFiles('#f', process.env.FILE);
  const r = await page.evaluate(async ([m, rate]) => { window.RATE = rate; window.chunks = 0; const x = await run(m, document.getElementById('f').files[0]); x.chunks = window.chunks; return x; }, [m, Number(process.env.RATE || 0)]);
  console.log(round, JSON.stringify(r));
}
await close();
