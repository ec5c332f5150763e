// POST /v1/embeddings against the official OpenAI client (npm package `openai`): a
// string, an array (each equal to the input alone), token ids (equal to the text they
// tokenize to), `dimensions`, base64 (the client's default, decoded by it) against
// floats, the error cases, and a streaming greedy completion that gives the same text
// while embedding requests run beside it. Exit code 77 = skipped.
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const h = require('./server_helpers.cjs');

const why = h.missing();
if (why) {
  console.log('SKIP: ' + why);
  process.exit(77);
}
const OpenAI = require(path.join(h.NODE_MODULES, 'openai'));
const MODEL = path.join(h.FIXTURES, 'models', 'llama-q8_0.gguf');
const N_EMBD = 256;  // the llama fixtures' n_embd
const CTX = 1024;

let server, client;
before(async () => {
  server = await h.startServer(['-m', MODEL, '--threads', '2', '--parallel', '4', '--ctx', String(CTX)]);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (!server) return;
  const code = await server.stop();
  assert.equal(code, 0, 'the server did not shut down cleanly:\n' + server.stderr());
});

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
// Embeddings of one input computed in different batches agree to float rounding on
// every backend (bit for bit on cpu_scalar).
function assertClose(a, b, what) {
  assert.equal(a.length, b.length, what);
  let worst = 0;
  for (let i = 0; i < a.length; ++i) worst = Math.max(worst, Math.abs(a[i] - b[i]));
  assert.ok(worst < 1e-4, `${what}: max difference ${worst}`);
}

const TEXTS = ['The quick brown fox', 'jumps over the lazy dog', 'Once upon a time, in a land far away'];

test('a string: one unit vector of n_embd values, base64 decoded by the client equals floats', async () => {
  const r = await client.embeddings.create({ model: 'llama-q8_0', input: TEXTS[0] });
  assert.equal(r.object, 'list');
  assert.equal(r.model, 'llama-q8_0');
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].object, 'embedding');
  assert.equal(r.data[0].index, 0);
  const v = r.data[0].embedding;
  assert.equal(v.length, N_EMBD);
  assert.ok(Math.abs(norm(v) - 1) < 1e-5, `norm ${norm(v)}`);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
  // float32 values as JSON numbers round-trip exactly: the same bits as the base64 form.
  const f = await client.embeddings.create({ model: 'm', input: TEXTS[0], encoding_format: 'float' });
  assert.deepEqual(f.data[0].embedding, v);
  const b = await client.embeddings.create({ model: 'm', input: TEXTS[0], encoding_format: 'base64' });
  assert.equal(typeof b.data[0].embedding, 'string');
  const buf = Buffer.from(b.data[0].embedding, 'base64');
  assert.equal(buf.length, N_EMBD * 4);
  assert.deepEqual(Array.from({ length: N_EMBD }, (_, i) => buf.readFloatLE(4 * i)), v);
});

test('an array of strings: one embedding per input, in order, each as the input alone', async () => {
  const r = await client.embeddings.create({ model: 'm', input: TEXTS });
  assert.equal(r.data.length, TEXTS.length);
  let tokens = 0;
  for (let i = 0; i < TEXTS.length; ++i) {
    assert.equal(r.data[i].index, i);
    const alone = await client.embeddings.create({ model: 'm', input: TEXTS[i] });
    tokens += alone.usage.prompt_tokens;
    assertClose(r.data[i].embedding, alone.data[0].embedding, `input ${i}`);
  }
  assert.equal(r.usage.prompt_tokens, tokens);
  // Different texts, different vectors.
  assert.ok(Math.abs(r.data[0].embedding[0] - r.data[1].embedding[0]) > 0 ||
            Math.abs(r.data[0].embedding[1] - r.data[1].embedding[1]) > 0);
});

test('token ids, and arrays of them, embed like the text they come from', async () => {
  const tok = await h.postJson(server.url + '/tokenize', { content: TEXTS[1], add_special: true });
  assert.equal(tok.status, 200);
  const ids = tok.json.tokens;
  const text = await client.embeddings.create({ model: 'm', input: TEXTS[1] });
  assert.equal(text.usage.prompt_tokens, ids.length);
  const one = await client.embeddings.create({ model: 'm', input: ids });
  assert.equal(one.data.length, 1);
  assertClose(one.data[0].embedding, text.data[0].embedding, 'token ids');
  const many = await client.embeddings.create({ model: 'm', input: [ids, [1, 40, 41]] });
  assert.equal(many.data.length, 2);
  assert.equal(many.usage.prompt_tokens, ids.length + 3);
  assertClose(many.data[0].embedding, text.data[0].embedding, 'first list of token ids');
});

test('dimensions keeps the first values, normalised again', async () => {
  const full = await client.embeddings.create({ model: 'm', input: TEXTS[2] });
  const short = await client.embeddings.create({ model: 'm', input: TEXTS[2], dimensions: 16 });
  const v = short.data[0].embedding;
  assert.equal(v.length, 16);
  assert.ok(Math.abs(norm(v) - 1) < 1e-5);
  const head = full.data[0].embedding.slice(0, 16), n = norm(head);
  assertClose(v, head.map((x) => x / n), 'truncated');
  // normalize: false (tessera's extension): the raw pooled state, longer than 1.
  const raw = await h.postJson(server.url + '/v1/embeddings', { input: TEXTS[2], encoding_format: 'float', normalize: false });
  assert.equal(raw.status, 200);
  const rv = raw.json.data[0].embedding, rn = norm(rv);
  assert.ok(Math.abs(rn - 1) > 1e-3, `raw norm ${rn}`);
  assertClose(rv.map((x) => x / rn), full.data[0].embedding, 'raw / its norm');
});

test('bad requests are 400s naming the field', async () => {
  const cases = [
    [{ input: '' }, 'input'],
    [{ input: [] }, 'input'],
    [{}, 'input'],
    [{ input: 5 }, 'input'],
    [{ input: [[]] }, 'input'],
    [{ input: ['a', 3] }, 'input'],
    [{ input: [1, 'a'] }, 'input'],
    [{ input: [1, 5000] }, 'input'],
    [{ input: [1, -1] }, 'input'],
    [{ input: 'x', dimensions: 0 }, 'dimensions'],
    [{ input: 'x', dimensions: N_EMBD + 1 }, 'dimensions'],
    [{ input: 'x', dimensions: 'small' }, 'dimensions'],
    [{ input: 'x', encoding_format: 'int8' }, 'encoding_format'],
    [{ input: 'x', model: 7 }, 'model'],
  ];
  for (const [body, param] of cases) {
    const r = await h.postJson(server.url + '/v1/embeddings', body);
    assert.equal(r.status, 400, JSON.stringify(body) + ' -> ' + r.text);
    assert.equal(r.json.error.param, param, JSON.stringify(body) + ' -> ' + r.text);
  }
  // Longer than the context: OpenAI's code, through the client's error class.
  await assert.rejects(client.embeddings.create({ model: 'm', input: Array(CTX + 1).fill(5) }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.code, 'context_length_exceeded');
    return true;
  });
  await assert.rejects(client.embeddings.create({ model: 'm', input: '' }), OpenAI.BadRequestError);
});

test('a client that goes away mid-request is cancelled and its KV pages freed', async () => {
  // 1024 inputs of about 250 tokens: seconds of work on any machine.
  const input = Array.from({ length: 1024 }, (_, i) => `${i} ${TEXTS[i % 3]} `.repeat(6));
  const cancelled = await h.metric(server.url, 'tessera_requests_cancelled_total');
  const answered = await h.metric(server.url, 'tessera_embedding_requests_total');
  const abort = new AbortController();
  const req = fetch(server.url + '/v1/embeddings', { method: 'POST', signal: abort.signal,
    headers: { 'content-type': 'application/json' }, body: JSON.stringify({ input }) });
  await h.waitFor(async () => (await h.metric(server.url, 'tessera_kv_pages_used')) > 0);
  abort.abort();
  await assert.rejects(req);
  assert.ok(await h.waitFor(async () => (await h.metric(server.url, 'tessera_requests_cancelled_total')) === cancelled + 1),
            'not cancelled');
  assert.ok(await h.waitFor(async () => (await h.metric(server.url, 'tessera_kv_pages_used')) === 0), 'KV pages still held');
  assert.equal(await h.metric(server.url, 'tessera_embedding_requests_total'), answered);
  const r = await client.embeddings.create({ model: 'm', input: 'still serving' });
  assert.equal(r.data.length, 1);
});

test('a streaming greedy completion gives the same text while embeddings run beside it', async () => {
  // Long enough that the stream outlasts six embedding requests on a loaded machine: the
  // fixture decodes a token in well under a millisecond.
  const prompt = 'In the beginning there was';
  const req = { model: 'm', prompt, max_tokens: 1000, temperature: 0, ignore_eos: true };
  const alone = (await client.completions.create(req)).choices[0].text;
  const want = (await client.embeddings.create({ model: 'm', input: TEXTS })).data.map((d) => d.embedding);

  // The embeddings start once the stream has sent its first text, and are all answered
  // before it ends: they run between its steps, not after it.
  let started, streamEnded = false;
  const firstText = new Promise((r) => { started = r; });
  const streamed = (async () => {
    const stream = await client.completions.create({ ...req, stream: true });
    let text = '';
    for await (const chunk of stream) for (const c of chunk.choices) { text += c.text; if (text) started(); }
    streamEnded = true;
    return text;
  })();
  await firstText;
  const before = await h.metric(server.url, 'tessera_embedding_requests_total');
  const embeds = [];
  for (let i = 0; i < 6; ++i) embeds.push(client.embeddings.create({ model: 'm', input: [...TEXTS, TEXTS[i % 3].repeat(8)] }));
  const got = await Promise.all(embeds);
  assert.equal(streamEnded, false, 'the embeddings waited for the stream to end');
  assert.equal(await streamed, alone);
  for (const r of got) for (let i = 0; i < TEXTS.length; ++i) assertClose(r.data[i].embedding, want[i], `input ${i}`);
  assert.equal(await h.metric(server.url, 'tessera_embedding_requests_total'), before + 6);
  // No KV page is left held once everything is done.
  assert.ok(await h.waitFor(async () => (await h.metric(server.url, 'tessera_kv_pages_used')) === 0),
            'KV pages still held');
});
