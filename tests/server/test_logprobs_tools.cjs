// Log-probabilities and tools against `tessera serve` with the official OpenAI client
// and raw HTTP: completions' and chat's logprobs (whole and streamed, with stop strings),
// their errors, and `tools`: accepted, validated, rendered by the template exactly as
// the chat-template fixtures expect (earlier calls' JSON-text arguments included), and
// streamed through the tool-call filter without losing text. (A random-weights model
// writes no tool calls; the parser is tested in test_server_units.) Exit code 77 = skipped.
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const fs = require('node:fs');
const { execFileSync } = require('node:child_process');
const h = require('./server_helpers.cjs');

const why = h.missing();
if (why) {
  console.log('SKIP: ' + why);
  process.exit(77);
}
const OpenAI = require(path.join(h.NODE_MODULES, 'openai'));
const MODEL = path.join(h.FIXTURES, 'models', 'llama-q8_0.gguf');
const TEMPLATES = path.join(h.FIXTURES, 'chat_templates');
const TEMPLATE = path.join(TEMPLATES, 'templates', 'Qwen-Qwen3-0.6B.jinja');

let server, client;
before(async () => {
  server = await h.startServer(['-m', MODEL, '--threads', '2', '--parallel', '4', '--ctx', '1024',
                                '--chat-template', TEMPLATE]);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (!server) return;
  const code = await server.stop();
  assert.equal(code, 0, 'the server did not shut down cleanly:\n' + server.stderr());
});

const chars = (s) => Array.from(s).length;  // text_offset counts Unicode characters

async function streamCompletion(body) {
  const stream = await client.completions.create({ ...body, stream: true });
  const out = { text: '', tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [], finish: null };
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      out.text += c.text;
      if (c.finish_reason) out.finish = c.finish_reason;
      if (c.logprobs) for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) out[k].push(...c.logprobs[k]);
    }
  }
  return out;
}

test('completions: logprobs per token, greedy picks the most likely, the stream says the same', async () => {
  const body = { model: 'm', prompt: 'Once upon a time', max_tokens: 12, temperature: 0, ignore_eos: true, logprobs: 3 };
  const r = await client.completions.create(body);
  const c = r.choices[0], lp = c.logprobs;
  assert.equal(r.usage.completion_tokens, 12);
  assert.equal(lp.tokens.length, 12);
  assert.equal(lp.token_logprobs.length, 12);
  assert.equal(lp.top_logprobs.length, 12);
  assert.deepEqual(lp.text_offset.slice(0, 1), [0]);
  for (let i = 0; i < 12; ++i) {
    const top = lp.top_logprobs[i];
    const values = Object.values(top);
    assert.ok(values.length >= 1 && values.length <= 4, JSON.stringify(top));
    assert.ok(lp.token_logprobs[i] <= 0);
    assert.equal(lp.token_logprobs[i], Math.max(...values), `token ${i}: greedy took the most likely token`);
    assert.equal(top[lp.tokens[i]], lp.token_logprobs[i]);
    if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
  }
  if (!lp.tokens.some((t) => t.startsWith('bytes:'))) {
    assert.equal(lp.tokens.join(''), c.text);
    let off = 0;
    lp.tokens.forEach((t, i) => { assert.equal(lp.text_offset[i], off); off += chars(t); });
  }
  const s = await streamCompletion(body);
  assert.equal(s.text, c.text);
  assert.deepEqual(s.tokens, lp.tokens);
  assert.deepEqual(s.token_logprobs, lp.token_logprobs);
  assert.deepEqual(s.top_logprobs, lp.top_logprobs);
  assert.deepEqual(s.text_offset, lp.text_offset);
  // Without logprobs: the same text, and no logprobs.
  const plain = await client.completions.create({ ...body, logprobs: undefined });
  assert.equal(plain.choices[0].text, c.text);
  assert.equal(plain.choices[0].logprobs, null);
});

test('completions: a stop string cuts the logprobs where it cuts the text', async () => {
  const body = { model: 'm', prompt: [1, 50, 60, 70], max_tokens: 16, temperature: 0, ignore_eos: true, logprobs: 0 };
  const full = await client.completions.create(body);
  const text = full.choices[0].text, lp = full.choices[0].logprobs;
  // A stop string of two ASCII characters from the answer's second half.
  const arr = Array.from(text);
  let at = Math.floor(arr.length / 2);
  while (at + 1 < arr.length && !/^[!-~]{2}$/.test(arr[at] + arr[at + 1])) ++at;
  assert.ok(at + 1 < arr.length, "no two ASCII characters in a row in the answer: " + text);
  const stop = arr[at] + arr[at + 1];
  const cut = text.slice(0, text.indexOf(stop));
  const cutChars = chars(cut);
  const expected = lp.tokens.filter((_, i) => lp.text_offset[i] < cutChars);
  for (const r of [await client.completions.create({ ...body, stop }), null]) {
    const got = r ? r.choices[0] : null;
    const res = got ? { text: got.text, tokens: got.logprobs.tokens, finish: got.finish_reason }
                    : await streamCompletion({ ...body, stop });
    assert.equal(res.text, cut);
    assert.equal(res.finish, 'stop');
    assert.deepEqual(res.tokens, expected, 'the tokens reported are those whose text starts before the stop string');
  }
});

test('chat: logprobs.content with bytes and top_logprobs, whole and streamed', async () => {
  const body = { model: 'm', messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 10, temperature: 0,
                 logprobs: true, top_logprobs: 2 };
  const r = await client.chat.completions.create(body);
  const msg = r.choices[0].message, content = r.choices[0].logprobs.content;
  assert.ok(content.length >= 1 && content.length <= 10);
  for (const t of content) {
    assert.equal(typeof t.token, 'string');
    assert.ok(Array.isArray(t.bytes) && t.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256));
    assert.equal(t.top_logprobs.length, 2);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
    assert.equal(t.logprob, t.top_logprobs[0].logprob, 'greedy took the most likely token');
    assert.deepEqual(t.top_logprobs[0].bytes, t.bytes);
  }
  const bytes = Buffer.from(content.flatMap((t) => t.bytes));
  if (!msg.content.includes('\uFFFD')) assert.equal(bytes.toString('utf8'), msg.content);
  const stream = await client.chat.completions.create({ ...body, stream: true });
  let text = '';
  const streamed = [];
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    text += ch.delta?.content ?? '';
    if (ch.logprobs) streamed.push(...ch.logprobs.content);
  }
  assert.equal(text, msg.content);
  assert.deepEqual(streamed, content);
  // logprobs: true alone gives no alternatives.
  const bare = await client.chat.completions.create({ ...body, top_logprobs: undefined });
  assert.ok(bare.choices[0].logprobs.content.every((t) => t.top_logprobs.length === 0));
});

test('logprobs and tools: bad values are 400s in OpenAI\'s error shape', async () => {
  const chat = { messages: [{ role: 'user', content: 'x' }], max_tokens: 2 };
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }];
  const cases = [
    ['/v1/completions', { prompt: 'x', logprobs: 21 }, 'logprobs'],
    ['/v1/completions', { prompt: 'x', logprobs: -1 }, 'logprobs'],
    ['/v1/completions', { prompt: 'x', logprobs: true }, 'logprobs'],
    ['/v1/completions', { prompt: 'x', echo: true }, 'echo'],
    ['/v1/chat/completions', { ...chat, top_logprobs: 3 }, 'top_logprobs'],
    ['/v1/chat/completions', { ...chat, logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    ['/v1/chat/completions', { ...chat, logprobs: 'yes' }, 'logprobs'],
    ['/v1/chat/completions', { ...chat, tool_choice: 'required' }, 'tool_choice'],
    ['/v1/chat/completions', { ...chat, tools, tool_choice: { type: 'function', function: { name: 'get_time' } } }, 'tool_choice'],
    ['/v1/chat/completions', { ...chat, tools: [{ type: 'function' }] }, 'tools'],
    ['/v1/chat/completions', { ...chat, tools: [{ type: 'function', function: { name: 7 } }] }, 'tools'],
    ['/v1/chat/completions', { ...chat, tools: 'get_weather' }, 'tools'],
    ['/v1/chat/completions', { messages: [{ role: 'assistant', content: null, tool_calls: {} }] }, 'messages'],
  ];
  for (const [p, body, param] of cases) {
    const r = await h.postJson(server.url + p, body);
    assert.equal(r.status, 400, `${p} ${JSON.stringify(body)}: ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
    assert.equal(typeof r.json.error.message, 'string');
    assert.ok('type' in r.json.error && 'code' in r.json.error);
  }
  assert.equal((await fetch(server.url + '/health')).status, 200);
});

// The token count of a prompt text as the server tokenizes a rendered chat prompt.
function tokenCount(text) {
  const out = execFileSync(process.env.TESSERA_BIN, ['tokenize', '-m', MODEL, '--special', '--text', text], { encoding: 'utf8' });
  return out.trim().split(/\s+/).length;
}

test('tools reach the template: the prompt is the fixture rendering, earlier calls included', async () => {
  const cases = JSON.parse(fs.readFileSync(path.join(TEMPLATES, 'cases.json'), 'utf8')).cases;
  const expected = JSON.parse(fs.readFileSync(path.join(TEMPLATES, 'expected.json'), 'utf8'))['Qwen-Qwen3-0.6B'].cases;
  for (const name of ['tools', 'tool_round_trip']) {
    const c = cases[name];
    // What OpenAI's clients send: each earlier call's arguments as JSON text.
    const messages = c.messages.map((m) => !m.tool_calls ? m : {
      ...m, tool_calls: m.tool_calls.map((tc) => ({ ...tc, function: { ...tc.function, arguments: JSON.stringify(tc.function.arguments) } })),
    });
    const r = await client.chat.completions.create({ model: 'm', messages, tools: c.tools, max_tokens: 2, temperature: 0 });
    assert.equal(r.usage.prompt_tokens, tokenCount(expected[name].text), `${name}: the prompt differs from the template's rendering`);
    const without = await client.chat.completions.create({ model: 'm', messages, max_tokens: 2, temperature: 0 });
    assert.ok(r.usage.prompt_tokens > without.usage.prompt_tokens, 'the tools did not reach the prompt');
  }
});

test('chat with tools streams the same answer as without streaming (and tool_choice none)', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city.',
                   parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const body = { model: 'm', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, max_tokens: 24,
                 temperature: 0, logprobs: true };
  for (const tool_choice of [undefined, 'auto', 'none']) {
    const r = await client.chat.completions.create({ ...body, tool_choice });
    const msg = r.choices[0].message;
    // The random-weights fixture writes no tool call: plain content, its tokens all reported.
    assert.equal(msg.tool_calls, undefined);
    assert.equal(typeof msg.content, 'string');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    const stream = await client.chat.completions.create({ ...body, tool_choice, stream: true });
    let text = '', finish = null, n = 0;
    for await (const chunk of stream) {
      const ch = chunk.choices[0];
      if (!ch) continue;
      text += ch.delta?.content ?? '';
      assert.equal(ch.delta?.tool_calls, undefined);
      if (ch.logprobs) n += ch.logprobs.content.length;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    assert.equal(text, msg.content);
    assert.equal(finish, r.choices[0].finish_reason);
    assert.equal(n, r.choices[0].logprobs.content.length);
  }
});
