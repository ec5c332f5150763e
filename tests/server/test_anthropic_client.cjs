// `tessera serve`'s Anthropic Messages API against the official Anthropic client (npm
// package @anthropic-ai/sdk) and raw HTTP: a message equal to the chat endpoint's
// greedy answer, streaming (Anthropic's events in order, the accumulated message equal
// to the whole one), stop_sequences, a tool_use/tool_result conversation rendered by the
// template exactly as the fixture expects, count_tokens, errors in Anthropic's shape,
// x-api-key, a client that goes away mid-stream, a shutdown during Messages and
// Responses streams, and tool_use blocks from forced calls (tool_choice tool and any:
// the random-weights model writes a call only when its grammar makes it).
// Exit code 77 = skipped.
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const fs = require('node:fs');
const { execFileSync } = require('node:child_process');
const h = require('./server_helpers.cjs');

const why = h.missing('@anthropic-ai/sdk') || h.missing('openai');
if (why) {
  console.log('SKIP: ' + why);
  process.exit(77);
}
const Anthropic = require(path.join(h.NODE_MODULES, '@anthropic-ai/sdk'));
const OpenAI = require(path.join(h.NODE_MODULES, 'openai'));
const MODEL = path.join(h.FIXTURES, 'models', 'llama-q8_0.gguf');
const TEMPLATES = path.join(h.FIXTURES, 'chat_templates');
const TEMPLATE = path.join(TEMPLATES, 'templates', 'Qwen-Qwen3-0.6B.jinja');
const KEY = 'test-key';

let server, client;
before(async () => {
  server = await h.startServer(['-m', MODEL, '--threads', '2', '--parallel', '4', '--ctx', '1100',
                                '--chat-template', TEMPLATE, '--api-key', KEY]);
  client = new Anthropic({ baseURL: server.url, apiKey: KEY, maxRetries: 0 });
});
after(async () => {
  if (!server) return;
  const code = await server.stop();
  assert.equal(code, 0, 'the server did not shut down cleanly:\n' + server.stderr());
});

// A message without what differs between two runs of the same request (its id, the
// calls' generated ids).
const stable = (m) => JSON.parse(JSON.stringify(m, (k, v) => (k === 'id' ? undefined : v)));

const SYSTEM = 'You are a terse assistant.';
const USER = 'Name a prime number.';
const greedy = { model: 'claude-any', max_tokens: 16, temperature: 0, system: SYSTEM,
                 messages: [{ role: 'user', content: USER }] };

// Server-Sent Events of a raw response: [{event, data}].
async function rawEvents(body, headers = {}) {
  const r = await fetch(server.url + '/v1/messages', {
    method: 'POST', body: JSON.stringify({ ...body, stream: true }),
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01', ...headers },
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  const text = await r.text();
  assert.ok(text.endsWith('\n\n'), 'the stream ends with a blank line');
  return text.slice(0, -2).split('\n\n').map((ev) => {
    const m = ev.match(/^event: ([a-z_]+)\ndata: (.*)$/s);
    assert.ok(m, 'not an event: ' + JSON.stringify(ev));
    const data = JSON.parse(m[2]);
    assert.equal(data.type, m[1]);
    return { event: m[1], data };
  });
}

test('a message: the chat endpoint\'s greedy answer in Anthropic\'s Message object', async () => {
  const msg = await client.messages.create(greedy);
  assert.match(msg.id, /^msg_/);
  assert.equal(msg.type, 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.model, 'llama-q8_0');
  assert.ok(['end_turn', 'max_tokens'].includes(msg.stop_reason), msg.stop_reason);
  assert.equal(msg.stop_sequence, null);
  assert.ok(msg.usage.output_tokens >= 1 && msg.usage.output_tokens <= 16);
  assert.equal(msg.content.length, 1);
  assert.equal(msg.content[0].type, 'text');
  // The same conversation through OpenAI's chat endpoint: the same prompt, the same answer.
  const openai = new OpenAI({ baseURL: server.url + '/v1', apiKey: KEY, maxRetries: 0 });
  const chat = await openai.chat.completions.create({ model: 'm', max_tokens: 16, temperature: 0,
    messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: USER }] });
  assert.equal(msg.content[0].text, chat.choices[0].message.content);
  assert.equal(msg.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(msg.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(msg.stop_reason, chat.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
  // System as text blocks, the user turn as a text block: the same prompt.
  const blocks = await client.messages.create({ ...greedy, system: [{ type: 'text', text: SYSTEM }],
    messages: [{ role: 'user', content: [{ type: 'text', text: USER }] }], metadata: { user_id: 'u1' } });
  assert.deepEqual({ ...blocks, id: msg.id }, msg);
  // count_tokens renders the same prompt.
  const counted = await client.messages.countTokens({ model: 'm', system: SYSTEM, messages: greedy.messages });
  assert.deepEqual(counted, { input_tokens: msg.usage.input_tokens });
});

test('streaming: Anthropic\'s events in order, adding up to the whole message', async () => {
  const whole = await client.messages.create(greedy);
  const events = await rawEvents(greedy);
  const names = events.map((e) => e.event);
  // message_start, content_block_start, ping, content_block_delta..., content_block_stop,
  // message_delta, message_stop.
  assert.deepEqual(names.slice(0, 3), ['message_start', 'content_block_start', 'ping']);
  assert.deepEqual(names.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  const deltas = names.slice(3, -3);
  assert.ok(deltas.length >= 1 && deltas.every((n) => n === 'content_block_delta'), names.join(' '));
  const start = events[0].data.message;
  assert.deepEqual(start.content, []);
  assert.equal(start.stop_reason, null);
  assert.equal(start.usage.input_tokens, whole.usage.input_tokens);
  assert.deepEqual(events[1].data, { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
  const text = events.slice(3, -3).map((e) => {
    assert.equal(e.data.index, 0);
    assert.equal(e.data.delta.type, 'text_delta');
    return e.data.delta.text;
  }).join('');
  assert.equal(text, whole.content[0].text);
  const md = events[events.length - 2].data;
  assert.equal(md.delta.stop_reason, whole.stop_reason);
  assert.equal(md.usage.output_tokens, whole.usage.output_tokens);

  // The SDK: its event iterator (ping is skipped) and its accumulated final message.
  const stream = client.messages.stream(greedy);
  const seen = [];
  stream.on('streamEvent', (e) => seen.push(e.type));
  const final = await stream.finalMessage();
  // (How many deltas depends on how many tokens each wait collects: runs are compared.)
  const runs = (a) => a.filter((n, i) => n !== a[i - 1]);
  assert.deepEqual(runs(seen), runs(names.filter((n) => n !== 'ping')));
  assert.deepEqual({ ...final, id: whole.id }, whole);
  const raw = await client.messages.create({ ...greedy, stream: true });
  const types = [];
  for await (const e of raw) types.push(e.type);
  assert.deepEqual(runs(types), runs(seen));
});

test('stop_sequences: the text ends before the first one, and the message says which', async () => {
  const full = await client.messages.create({ ...greedy, max_tokens: 24 });
  const text = full.content[0].text;
  // A stop sequence of two ASCII characters from the answer's second half.
  const arr = Array.from(text);
  let at = Math.floor(arr.length / 2);
  while (at + 1 < arr.length && !/^[!-~]{2}$/.test(arr[at] + arr[at + 1])) ++at;
  assert.ok(at + 1 < arr.length, 'no two ASCII characters in a row in the answer: ' + text);
  const stop = arr[at] + arr[at + 1];
  const body = { ...greedy, max_tokens: 24, stop_sequences: ['never in it \u2603', stop] };
  const msg = await client.messages.create(body);
  assert.equal(msg.content[0].text, text.slice(0, text.indexOf(stop)));
  assert.equal(msg.stop_reason, 'stop_sequence');
  assert.equal(msg.stop_sequence, stop);
  assert.ok(msg.usage.output_tokens < full.usage.output_tokens);
  const final = await client.messages.stream(body).finalMessage();
  assert.deepEqual({ ...final, id: msg.id }, msg);
});

// The token count of a prompt text as the server tokenizes a rendered chat prompt.
function tokenCount(text) {
  const out = execFileSync(process.env.TESSERA_BIN, ['tokenize', '-m', MODEL, '--special', '--text', text], { encoding: 'utf8' });
  return out.trim().split(/\s+/).length;
}

test('tools: a tool_use/tool_result round trip reaches the template as the fixture renders it', async () => {
  const expected = JSON.parse(fs.readFileSync(path.join(TEMPLATES, 'expected.json'), 'utf8'))['Qwen-Qwen3-0.6B'].cases;
  const tools = [{ name: 'get_weather', description: 'Current weather for a city.',
                   input_schema: { type: 'object', properties: { city: { type: 'string', description: 'City name' },
                                                                 unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
                                   required: ['city'] } }];
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'call12345', name: 'get_weather',
                                     input: { city: 'Paris', unit: 'celsius' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call12345', content: '{"temp": 21, "sky": "clear"}' }] },
  ];
  const body = { model: 'm', max_tokens: 8, temperature: 0, tools, messages };
  const msg = await client.messages.create(body);
  assert.equal(msg.usage.input_tokens, tokenCount(expected.tool_round_trip.text), 'the prompt differs from the template\'s rendering');
  // The random-weights fixture writes no tool call: a text answer, streamed the same.
  assert.ok(msg.content.every((b) => b.type === 'text'));
  assert.ok(['end_turn', 'max_tokens'].includes(msg.stop_reason));
  assert.deepEqual({ ...(await client.messages.stream(body).finalMessage()), id: msg.id }, msg);
  for (const tool_choice of [{ type: 'auto' }, { type: 'none' }, { type: 'auto', disable_parallel_tool_use: true }]) {
    const m = await client.messages.create({ ...body, tool_choice });
    assert.deepEqual(m.content, msg.content, JSON.stringify(tool_choice));
  }
  const first = await client.messages.create({ ...body, system: 'You can call tools.', messages: messages.slice(0, 1) });
  assert.equal(first.usage.input_tokens, tokenCount(expected.tools.text));
});

// Arguments the forced call's grammar allows (the tool's input_schema below).
function checkInput(block) {
  assert.equal(block.type, 'tool_use');
  assert.equal(block.name, 'get_weather');
  assert.ok(typeof block.id === 'string' && block.id.length > 0);
  const { city, days, ...rest } = block.input;
  assert.ok(typeof city === 'string' && [...city].length >= 1 && [...city].length <= 10, JSON.stringify(block.input));
  assert.ok(Number.isInteger(days) && days >= 1 && days <= 7, JSON.stringify(block.input));
  assert.deepEqual(rest, {});
}

test('tool_choice tool and any: tool_use blocks whose input fits the schema, whole and streamed, then a tool_result turn', async () => {
  const tools = [{ name: 'get_weather', description: 'Weather for a city.', input_schema: {
    type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 10 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'], additionalProperties: false } }];
  const ask = [{ role: 'user', content: 'Weather in Paris?' }];
  const body = { model: 'm', max_tokens: 300, temperature: 0, tools, messages: ask, tool_choice: { type: 'tool', name: 'get_weather' } };
  const msg = await client.messages.create(body);
  assert.equal(msg.stop_reason, 'tool_use', JSON.stringify(msg));
  const uses = msg.content.filter((b) => b.type === 'tool_use');
  assert.ok(uses.length >= 1);
  uses.forEach(checkInput);
  // Streamed: each tool_use block starts with an empty input and gets it as input_json_delta.
  const events = await rawEvents(body);
  const starts = events.filter((e) => e.event === 'content_block_start' && e.data.content_block.type === 'tool_use');
  assert.equal(starts.length, uses.length);
  for (const st of starts) {
    assert.deepEqual(st.data.content_block.input, {});
    const json = events.filter((e) => e.event === 'content_block_delta' && e.data.index === st.data.index)
      .map((e) => { assert.equal(e.data.delta.type, 'input_json_delta'); return e.data.delta.partial_json; }).join('');
    assert.deepEqual(JSON.parse(json), uses[starts.indexOf(st)].input);
  }
  const final = await client.messages.stream(body).finalMessage();
  assert.deepEqual(stable(final), stable(msg));
  // The results go back as tool_result blocks; the next turn renders them.
  const next = await client.messages.create({ model: 'm', max_tokens: 8, temperature: 0, tools, messages: [
    ...ask, { role: 'assistant', content: msg.content },
    { role: 'user', content: uses.map((u) => ({ type: 'tool_result', tool_use_id: u.id, content: '21 C, clear' })) }] });
  assert.ok(next.usage.input_tokens > msg.usage.input_tokens);
  // any, one call only.
  const any = await client.messages.create({ ...body, temperature: 0.7, tool_choice: { type: 'any', disable_parallel_tool_use: true } });
  assert.equal(any.stop_reason, 'tool_use', JSON.stringify(any));
  assert.equal(any.content.filter((b) => b.type === 'tool_use').length, 1);
  checkInput(any.content.find((b) => b.type === 'tool_use'));
});

test('errors come back in Anthropic\'s shape with the right status', async () => {
  const cases = [
    [{ ...greedy, max_tokens: undefined }, /'max_tokens' is required/],
    [{ ...greedy, temperature: 1.5 }, /temperature/],
    [{ ...greedy, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } }] }] },
     /messages\.0\.content\.0: 'image' content blocks are not supported/],
    [{ ...greedy, max_tokens: 5000 }, /maximum context length/],
    [{ ...greedy, messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hel' }] }, /last message must be a user message/],
  ];
  for (const [body, says] of cases) {
    await assert.rejects(client.messages.create(body), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.error.type, 'error');
      assert.equal(e.error.error.type, 'invalid_request_error');
      assert.match(e.error.error.message, says);
      return true;
    });
  }
  const post = (p, body, headers = {}) => h.postJson(server.url + p, body, { 'x-api-key': KEY, ...headers });
  const checks = [
    [await post('/v1/messages', '{"model": '), 400, 'invalid_request_error', /invalid JSON body/],
    [await post('/v1/messages/batches', {}), 404, 'not_found_error', /unknown path/],
    [await post('/v1/messages', greedy, { 'x-api-key': 'wrong' }), 401, 'authentication_error', /invalid API key/],
    [await h.postJson(server.url + '/v1/messages', greedy), 401, 'authentication_error', /missing API key/],
    // A limit of the GuardedServer (--max-body, 8 MiB by default), answered before the body is read.
    [await post('/v1/messages', { ...greedy, system: 'x'.repeat(9 << 20) }), 413, 'request_too_large', /./],
  ];
  for (const [r, status, type, says] of checks) {
    assert.equal(r.status, status, r.text);
    assert.equal(r.json.type, 'error', r.text);
    assert.equal(r.json.error.type, type, r.text);
    assert.match(r.json.error.message, says);
  }
  await assert.rejects(new Anthropic({ baseURL: server.url, apiKey: 'wrong', maxRetries: 0 }).messages.create(greedy),
                       (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
  // OpenAI's paths keep OpenAI's shape; Bearer works for Anthropic's path too.
  const nf = await h.postJson(server.url + '/v1/nothing', {}, { authorization: 'Bearer ' + KEY });
  assert.equal(nf.json.error.code, 'not_found');
  assert.equal((await h.postJson(server.url + '/v1/messages', greedy, { authorization: 'Bearer ' + KEY })).status, 200);
});

test('a client that goes away mid-stream frees its sequence', async () => {
  const headers = { 'x-api-key': KEY };
  const cancelledBefore = await h.metric(server.url, 'tessera_requests_cancelled_total', headers);
  const generatedBefore = await h.metric(server.url, 'tessera_generated_tokens_total', headers);
  const ac = new AbortController();
  const r = await fetch(server.url + '/v1/messages', {
    method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ ...greedy, max_tokens: 1000, messages: [{ role: 'user', content: 'A long story' }], stream: true }),
  });
  const reader = r.body.getReader();
  await reader.read();  // message_start
  ac.abort();
  const freed = await h.waitFor(async () => (await h.metric(server.url, 'tessera_requests_running', headers)) === 0 &&
                                           (await h.metric(server.url, 'tessera_kv_pages_used', headers)) === 0 &&
                                           (await h.metric(server.url, 'tessera_requests_cancelled_total', headers)) === cancelledBefore + 1);
  assert.ok(freed, 'the sequence was not cancelled (or not counted as cancelled)');
  const generated = (await h.metric(server.url, 'tessera_generated_tokens_total', headers)) - generatedBefore;
  assert.ok(generated < 900, `the generation ran on after the client left (${generated} of 1000 tokens)`);
});

test('SIGTERM during Messages and Responses streams: each ends properly, new requests get 503 in their API\'s shape', async () => {
  // Answers long enough that no machine finishes them inside the 3 s drain, so the
  // shutdown has running requests to cut.
  const s = await h.startServer(['-m', MODEL, '--threads', '1', '--parallel', '4', '--ctx', '16384',
                                 '--chat-template', TEMPLATE, '--shutdown-timeout', '3']);
  const post = (p, body) => fetch(s.url + p, { method: 'POST', headers: { 'content-type': 'application/json' },
                                                body: JSON.stringify(body) });
  const conversation = [{ role: 'user', content: 'A long story' }];
  // ignore_eos (tessera's extension, as on chat): the answers run until the shutdown cuts them.
  const streams = await Promise.all([
    post('/v1/messages', { model: 'm', max_tokens: 16000, temperature: 0, stream: true, messages: conversation, ignore_eos: true }),
    post('/v1/messages', { model: 'm', max_tokens: 16000, temperature: 0.8, seed: 5, stream: true, messages: conversation,
                           ignore_eos: true }),
    post('/v1/responses', { model: 'm', max_output_tokens: 16000, temperature: 0, stream: true, input: conversation,
                            ignore_eos: true }),
  ]);
  for (const r of streams) assert.equal(r.status, 200);
  const texts = streams.map((r) => r.text());
  assert.ok(await h.waitFor(async () => await h.metric(s.url, 'tessera_requests_running') === 3, 5000));
  s.proc.removeAllListeners('exit');
  const exited = new Promise((res) => s.proc.once('exit', (code, signal) => res(signal ? `signal ${signal}` : code)));
  s.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 300));
  const late = await h.postJson(s.url + '/v1/messages', { model: 'm', max_tokens: 2, messages: conversation });
  assert.equal(late.status, 503);
  assert.deepEqual(late.json, { type: 'error', error: { type: 'overloaded_error', message: 'the server is shutting down' } });
  const lateResponse = await h.postJson(s.url + '/v1/responses', { model: 'm', max_output_tokens: 2, input: 'x' });
  assert.equal(lateResponse.status, 503);
  assert.equal(lateResponse.json.error.code, 'shutting_down');
  assert.equal(await exited, 0, s.stderr());
  assert.match(s.stderr(), /ending 3 running requests/);  // they were cut, not finished
  const [m1, m2, resp] = await Promise.all(texts);
  for (const text of [m1, m2]) {
    const events = text.trim().split('\n\n').map((e) => e.split('\n')[0].slice('event: '.length));
    assert.deepEqual(events.slice(-2), ['message_delta', 'message_stop'], text.slice(-300));
    const delta = JSON.parse(text.trim().split('\n\n').slice(-2)[0].split('\n')[1].slice('data: '.length));
    assert.equal(delta.delta.stop_reason, 'max_tokens');
  }
  const last = resp.trim().split('\n\n').pop();
  assert.match(last, /^event: response\.incomplete\n/);
  assert.equal(JSON.parse(last.split('\n')[1].slice('data: '.length)).response.status, 'incomplete');
});
