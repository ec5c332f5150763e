// `tessera serve` against the official OpenAI client (npm package `openai`) and raw
// HTTP: completions, chat, streaming, usage, every error case, a client that goes
// away mid-stream, and a bounded load test (16 concurrent streaming clients x 4
// requests, each answer equal to the same request alone). Exit code 77 = skipped.
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
const TEMPLATE = path.join(h.FIXTURES, 'chat_templates', 'templates', 'Qwen-Qwen3-0.6B.jinja');

let server, client;
before(async () => {
  server = await h.startServer(['-m', MODEL, '--threads', '2', '--parallel', '8', '--ctx', '1100',
                                '--chat-template', TEMPLATE, '--queue', '64']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (!server) return;
  const code = await server.stop();
  assert.equal(code, 0, 'the server did not shut down cleanly:\n' + server.stderr());
});

test('models lists the file name', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['llama-q8_0']);
});

test('completion with usage and a length finish', async () => {
  const r = await client.completions.create({ model: 'llama-q8_0', prompt: 'Once upon a time', max_tokens: 7, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 7);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 7);
  // Greedy is deterministic.
  const again = await client.completions.create({ model: 'llama-q8_0', prompt: 'Once upon a time', max_tokens: 7, temperature: 0 });
  assert.equal(again.choices[0].text, r.choices[0].text);
});

test('token-id prompt, seed, stop string', async () => {
  const a = await client.completions.create({ model: 'm', prompt: [1, 50, 60, 70], max_tokens: 12, temperature: 0.9, seed: 5 });
  const b = await client.completions.create({ model: 'm', prompt: [1, 50, 60, 70], max_tokens: 12, temperature: 0.9, seed: 5 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  const full = a.choices[0].text;
  if (full.length >= 4) {
    const stop = full.slice(2, 4);
    const s = await client.completions.create({ model: 'm', prompt: [1, 50, 60, 70], max_tokens: 12, temperature: 0.9, seed: 5, stop });
    assert.equal(s.choices[0].text, full.slice(0, full.indexOf(stop)));
    assert.equal(s.choices[0].finish_reason, 'stop');
  }
});

test('streaming completion matches the whole answer and carries usage', async () => {
  const whole = await client.completions.create({ model: 'm', prompt: 'The sea', max_tokens: 10, temperature: 0 });
  const stream = await client.completions.create({ model: 'm', prompt: 'The sea', max_tokens: 10, temperature: 0,
                                                   stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 10);
});

test('chat completion and chat streaming through the template', async () => {
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: [{ type: 'text', text: 'Hello!' }] }];
  const r = await client.chat.completions.create({ model: 'm', messages, max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  const stream = await client.chat.completions.create({ model: 'm', messages, max_completion_tokens: 6, temperature: 0, stream: true });
  let text = '', role = null, finish = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta || {};
    if (d.role) role = d.role;
    if (d.content) text += d.content;
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, r.choices[0].message.content);
  assert.equal(finish, r.choices[0].finish_reason);
});

test('n choices: each is the same request with seed + its index; streamed by index', async () => {
  const body = { model: 'llama-q8_0', prompt: 'Once upon a time', max_tokens: 12, temperature: 1.0, seed: 7,
                 stop: ['zz'] };
  const r = await client.completions.create({ ...body, n: 3 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  let tokens = 0;
  for (let i = 0; i < 3; i++) {
    const one = await client.completions.create({ ...body, seed: 7 + i });
    assert.equal(r.choices[i].text, one.choices[0].text, `choice ${i}`);
    assert.equal(r.choices[i].finish_reason, one.choices[0].finish_reason, `choice ${i}`);
    tokens += one.usage.completion_tokens;
  }
  assert.notEqual(r.choices[0].text, r.choices[1].text);
  assert.equal(r.usage.completion_tokens, tokens);
  assert.equal(r.usage.prompt_tokens, (await client.completions.create({ ...body, max_tokens: 1 })).usage.prompt_tokens);
  // A stop string that ends choice 1 early ends only that choice.
  const stop = [...r.choices[1].text].slice(2, 4).join('');
  const s = await client.completions.create({ ...body, n: 3, stop: [stop] });
  assert.ok(s.choices[1].text.length < r.choices[1].text.length, JSON.stringify(stop));
  for (let i = 0; i < 3; i++) {
    const one = await client.completions.create({ ...body, seed: 7 + i, stop: [stop] });
    assert.equal(s.choices[i].text, one.choices[0].text, `choice ${i} with stop ${JSON.stringify(stop)}`);
  }
  // Chat, streamed: the deltas of each index add up to that choice's whole answer.
  const chat = { model: 'llama-q8_0', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 10, temperature: 1.0,
                 seed: 3, n: 2 };
  const whole = await client.chat.completions.create(chat);
  const texts = ['', ''], finishes = [null, null];
  for await (const chunk of await client.chat.completions.create({ ...chat, stream: true })) {
    for (const c of chunk.choices) {
      if (c.delta?.content) texts[c.index] += c.delta.content;
      if (c.finish_reason) finishes[c.index] = c.finish_reason;
    }
  }
  assert.deepEqual(texts, whole.choices.map((c) => c.message.content));
  assert.deepEqual(finishes, whole.choices.map((c) => c.finish_reason));
});

test('errors come back as OpenAI error objects', async () => {
  await assert.rejects(client.completions.create({ model: 'm', prompt: 'x', max_tokens: 0 }),
                       (e) => e.status === 400 && e.param === 'max_tokens');
  await assert.rejects(client.completions.create({ model: 'm', prompt: 'x', max_tokens: 5000 }),
                       (e) => e.status === 400 && /maximum context length/.test(e.message));
  const u = server.url;
  const cases = [
    ['/v1/completions', '{not json', 400, 'invalid_json'],
    ['/v1/completions', { prompt: 'x', temperature: 'hot' }, 400, 'invalid_type'],
    ['/v1/completions', { prompt: 'x', n: 17 }, 400, 'invalid_value'],
    ['/v1/completions', { prompt: 'x', n: 0 }, 400, 'invalid_value'],
    ['/v1/completions', { max_tokens: 3 }, 400, 'missing_required_parameter'],
    ['/v1/completions', { prompt: [1, 99999] }, 400, 'invalid_value'],
    ['/v1/completions', { prompt: 'x', stop: 5 }, 400, 'invalid_type'],
    ['/v1/completions', { prompt: 'x', logit_bias: { abc: 1 } }, 400, 'invalid_value'],
    ['/v1/completions', [1, 2], 400, 'invalid_type'],
    ['/v1/chat/completions', { max_tokens: 3 }, 400, 'missing_required_parameter'],
    ['/v1/chat/completions', { messages: [{ role: 'wizard', content: 'x' }] }, 400, 'invalid_value'],
    ['/v1/chat/completions', { messages: 'hi' }, 400, 'invalid_type'],
  ];
  for (const [p, body, status, code] of cases) {
    const r = await h.postJson(u + p, body);
    assert.equal(r.status, status, `${p} ${JSON.stringify(body)}: ${r.text}`);
    assert.equal(r.json.error.code, code, `${p} ${JSON.stringify(body)}: ${r.text}`);
    assert.equal(typeof r.json.error.message, 'string');
    assert.ok('type' in r.json.error && 'param' in r.json.error);
  }
  const nf = await fetch(u + '/v2/nothing');
  assert.equal(nf.status, 404);
  assert.equal((await nf.json()).error.code, 'not_found');
});

test('a client that goes away mid-stream frees its sequence', async () => {
  const generatedBefore = await h.metric(server.url, 'tessera_generated_tokens_total');
  const ac = new AbortController();
  const r = await fetch(server.url + '/v1/completions', {
    method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'A long story', max_tokens: 1000, temperature: 0, stream: true, ignore_eos: true }),
  });
  const reader = r.body.getReader();
  await reader.read();  // the first chunk
  ac.abort();
  const freed = await h.waitFor(async () => (await h.metric(server.url, 'tessera_requests_running')) === 0 &&
                                           (await h.metric(server.url, 'tessera_kv_pages_used')) === 0);
  assert.ok(freed, 'the sequence was not cancelled');
  const generated = (await h.metric(server.url, 'tessera_generated_tokens_total')) - generatedBefore;
  assert.ok(generated < 900, `the generation ran on after the client left (${generated} of 1000 tokens)`);
});

test('16 concurrent streaming clients x 4 requests: no errors, same answers as alone', async () => {
  const prompts = [];
  for (let i = 0; i < 16; ++i) prompts.push(`Client ${i} asks about the number ${i * 7} and the sea`);
  const alone = {};
  for (const p of prompts) {
    const r = await client.completions.create({ model: 'm', prompt: p, max_tokens: 12, temperature: 0, ignore_eos: true });
    alone[p] = r.choices[0].text;
  }
  const worker = async (p) => {
    for (let k = 0; k < 4; ++k) {
      const stream = await client.completions.create({ model: 'm', prompt: p, max_tokens: 12, temperature: 0,
                                                       ignore_eos: true, stream: true });
      let text = '';
      for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
      assert.equal(text, alone[p], `answer to "${p}" differs from the same request alone`);
    }
  };
  await Promise.all(prompts.map(worker));
  assert.ok(await h.waitFor(async () => (await h.metric(server.url, 'tessera_requests_running')) === 0));
  assert.equal(await h.metric(server.url, 'tessera_kv_pages_used'), 0);
  assert.ok((await h.metric(server.url, 'tessera_generated_tokens_total')) >= 16 * 4 * 12);
});
