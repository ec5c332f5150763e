// Embeddings on a running `tessera serve`: N texts of about W words sent as one
// /v1/embeddings request, then as N requests of one text, alternated R times; reports
// the median of each (texts/s, tokens/s).
//   node bench/embeddings.cjs URL [texts=64] [words=16] [repeats=7]
'use strict';
const [url, nTexts = '64', nWords = '16', repeats = '7'] = process.argv.slice(2);
if (!url) {
  console.error('usage: node bench/embeddings.cjs URL [texts] [words] [repeats]');
  process.exit(2);
}
const words = 'the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you were her she there one all we their has been would when who will more if no out so said what up its about into than them can only other new some could time these two may then do first any my now such like our over man'.split(' ');
let x = 12345;
const texts = Array.from({ length: Number(nTexts) }, () => Array.from({ length: Number(nWords) }, () => {
  x = (x * 1103515245 + 12345) % 2147483648;
  return words[x % words.length];
}).join(' '));

async function embed(input) {
  const r = await fetch(url + '/v1/embeddings', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ input, encoding_format: 'base64' }),
  });
  const j = await r.json();
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${JSON.stringify(j)}`);
  return j.usage.prompt_tokens;
}

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];
(async () => {
  await embed(texts.slice(0, 2));  // warm-up
  const batch = [], single = [];
  let tokens = 0;
  for (let r = 0; r < Number(repeats); ++r) {
    let t = performance.now();
    tokens = await embed(texts);
    batch.push((performance.now() - t) / 1000);
    t = performance.now();
    for (const s of texts) await embed(s);
    single.push((performance.now() - t) / 1000);
  }
  const n = texts.length;
  for (const [name, v] of [[`one request of ${n}`, batch], [`${n} requests of 1`, single]]) {
    const m = median(v);
    console.log(`${name}: median ${m.toFixed(3)} s, ${(n / m).toFixed(1)} texts/s, ${(tokens / m).toFixed(0)} tokens/s ` +
                `(runs ${v.map((s) => s.toFixed(3)).join(' ')})`);
  }
})().catch((e) => { console.error(e.message); process.exit(1); });
