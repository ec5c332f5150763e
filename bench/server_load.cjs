// Load on a running `tessera serve`: C concurrent streaming clients, each sending R
// completions of a ~50-word prompt with a fixed answer length; reports the aggregate
// generated tokens/s and the time to first token (p50, p99).
//   node bench/server_load.cjs URL [clients=8] [requests_per_client=2] [max_tokens=64] [salt=0] [stagger_ms=0]
//                              [temperature=0.7] [spec_n_max=0]
// (a different salt gives different prompts: no prefix-cache hits across runs; with
// stagger_ms client c starts c * stagger_ms after the first, so the batch's mix of
// prefill and decode changes from step to step instead of moving in lockstep; with
// spec_n_max > 0 the odd clients ask for speculative decoding with that many drafted
// tokens and the even ones turn it off, on a server started with --spec)
'use strict';
const [url, clients = '8', perClient = '2', maxTokens = '64', salt = '0', staggerMs = '0', temperature = '0.7',
       specNMax = '0'] = process.argv.slice(2);
if (!url) {
  console.error('usage: node bench/server_load.cjs URL [clients] [requests_per_client] [max_tokens] [salt] [stagger_ms] ' +
                '[temperature] [spec_n_max]');
  process.exit(2);
}
const words = 'the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you were her she there one all we their has been would when who will more if no out so said what up its about into than them can only other new some could time these two may then do first any my now such like our over man'.split(' ');

function prompt(seed) {
  let x = (seed + Number(salt) * 7919) * 2654435761 % 4294967296;
  const out = [];
  for (let i = 0; i < 50; ++i) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out.push(words[x % words.length]);
  }
  return out.join(' ');
}

async function one(seed, client) {
  const t0 = performance.now();
  const body = { prompt: prompt(seed), max_tokens: Number(maxTokens), temperature: Number(temperature), seed,
                 ignore_eos: true, stream: true, stream_options: { include_usage: true } };
  if (Number(specNMax) > 0) body['speculative.n_max'] = client % 2 ? Number(specNMax) : 0;
  const r = await fetch(url + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const dec = new TextDecoder();
  let buf = '', ttft = null, tokens = 0;
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (ttft === null && j.choices.length && j.choices[0].text) ttft = performance.now() - t0;
      if (j.usage) tokens = j.usage.completion_tokens;
    }
  }
  return { ttft: ttft ?? performance.now() - t0, tokens };
}

(async () => {
  const C = Number(clients), R = Number(perClient);
  const t0 = performance.now();
  const results = await Promise.all(Array.from({ length: C }, async (_, c) => {
    if (Number(staggerMs) > 0) await new Promise((r) => setTimeout(r, c * Number(staggerMs)));
    const out = [];
    for (let k = 0; k < R; ++k) out.push(await one(c * 1000 + k, c));
    return out;
  }));
  const wall = (performance.now() - t0) / 1000;
  const all = results.flat();
  const tokens = all.reduce((a, r) => a + r.tokens, 0);
  const ttfts = all.map((r) => r.ttft).sort((a, b) => a - b);
  const pct = (p) => ttfts[Math.min(ttfts.length - 1, Math.floor(p * ttfts.length))];
  console.log(JSON.stringify({ clients: C, requests: all.length, tokens, wall_s: +wall.toFixed(3),
                               aggregate_tok_s: +(tokens / wall).toFixed(2),
                               ttft_ms_p50: +pct(0.5).toFixed(1), ttft_ms_p99: +pct(0.99).toFixed(1) }));
})().catch((e) => { console.error(e.message); process.exit(1); });
