// gpt-oss's harmony format end to end: `tessera serve` on the gpt-oss fixture with the
// gpt-oss template, through the official OpenAI and Anthropic clients. The fixture's
// 1024-piece vocabulary has no harmony tokens, so the model spells the markers with
// ordinary tokens, and its random weights write them only when a grammar makes them:
// each request carries a GBNF `grammar` that forces a harmony answer (analysis then
// final, or a call), and the test checks what the server makes of it: reasoning and
// content apart with no marker in either, the call as tool_calls, streams adding up to
// the whole answer, Anthropic's thinking block and the Responses reasoning item. The
// parser itself, and the marker tokens of a real vocabulary, are tested in
// test_server_units. Exit code 77 = skipped.
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const h = require('./server_helpers.cjs');

const why = h.missing() || h.missing('@anthropic-ai/sdk');
if (why) {
  console.log('SKIP: ' + why);
  process.exit(77);
}
const OpenAI = require(path.join(h.NODE_MODULES, 'openai'));
const Anthropic = require(path.join(h.NODE_MODULES, '@anthropic-ai/sdk'));
const MODEL = path.join(h.FIXTURES, 'models', 'gpt-oss-f32.gguf');
const TEMPLATE = path.join(h.FIXTURES, 'chat_templates', 'templates', 'openai-gpt-oss-120b.jinja');

let server, client, anthropic;
before(async () => {
  server = await h.startServer(['-m', MODEL, '--threads', '2', '--parallel', '2', '--ctx', '2048',
                                '--chat-template', TEMPLATE]);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: server.url, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (!server) return;
  const code = await server.stop();
  assert.equal(code, 0, 'the server did not shut down cleanly:\n' + server.stderr());
});

const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather.',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const THINK_THEN_ANSWER = 'root ::= "<|channel|>analysis<|message|>" [a-z]{2,12} ' +
  '"<|end|><|start|>assistant<|channel|>final<|message|>" [a-z]{2,12}\n';
const CALL = 'root ::= "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\\"city\\": \\"" ' +
  '[a-z]{2,8} "\\"}"\n';
const base = { model: 'm', messages: [{ role: 'user', content: 'Weather in Paris?' }], temperature: 0, max_tokens: 200 };

async function streamChat(body) {
  const out = { content: '', reasoning: '', calls: [], finish: null, deltas: [] };
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.content) out.content += c.delta.content;
    if (c.delta.reasoning_content) out.reasoning += c.delta.reasoning_content;
    if (c.delta.tool_calls) out.calls.push(...c.delta.tool_calls);
    if (c.finish_reason) out.finish = c.finish_reason;
    out.deltas.push(c.delta);
  }
  return out;
}

test('analysis becomes reasoning_content, final the content; the stream says the same', async () => {
  const body = { ...base, grammar: THINK_THEN_ANSWER };
  const r = await client.chat.completions.create(body);
  const m = r.choices[0].message;
  assert.match(m.reasoning_content, /^[a-z]{2,12}$/);
  assert.match(m.content, /^[a-z]{2,12}$/);
  assert.equal(r.choices[0].finish_reason, 'stop');
  // The analysis message's tokens (markers spelled out included) are reasoning tokens.
  const reasoningTokens = r.usage.completion_tokens_details.reasoning_tokens;
  assert.ok(reasoningTokens > m.reasoning_content.length && reasoningTokens < r.usage.completion_tokens);
  const s = await streamChat(body);
  assert.equal(s.reasoning, m.reasoning_content);
  assert.equal(s.content, m.content);
  for (const d of s.deltas) assert.ok(!(d.content || '').includes('<|') && !(d.reasoning_content || '').includes('<|'));
  // The reasoning streams before the content.
  const first = (k) => s.deltas.findIndex((d) => d[k]);
  assert.ok(first('reasoning_content') < first('content'));
});

test('a commentary message to functions.NAME is a tool call', async () => {
  const body = { ...base, tools: TOOLS, grammar: CALL };
  const r = await client.chat.completions.create(body);
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  assert.match(JSON.parse(c.message.tool_calls[0].function.arguments).city, /^[a-z]{2,8}$/);
  const s = await streamChat(body);
  assert.equal(s.finish, 'tool_calls');
  assert.equal(s.content, '');
  assert.equal(s.calls.length, 1);
  assert.equal(s.calls[0].function.arguments, c.message.tool_calls[0].function.arguments);
  // Without tools such an answer is no call: its text is the content.
  const plain = await client.chat.completions.create({ ...base, grammar: CALL });
  assert.equal(plain.choices[0].finish_reason, 'stop');
  assert.match(plain.choices[0].message.content, /^\{"city": "[a-z]{2,8}"\}$/);
  assert.equal(plain.choices[0].message.tool_calls, undefined);
});

test('a forced call is accepted in harmony; the answer is reasoning or a call, never markers', async () => {
  const r = await client.chat.completions.create({ ...base, tools: TOOLS, tool_choice: 'required', max_tokens: 48 });
  const c = r.choices[0];
  // The random model may think until max_tokens (the grammar allows an analysis
  // message before the call); either way nothing of the format leaks into content.
  if (c.finish_reason === 'tool_calls') {
    assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
    assert.equal(typeof JSON.parse(c.message.tool_calls[0].function.arguments).city, 'string');
  } else {
    assert.equal(c.finish_reason, 'length');
    assert.ok(c.message.reasoning_content.length > 0);
    assert.equal(c.message.content, '');
  }
});

test('an earlier answer\'s reasoning_content reaches the template as thinking', async () => {
  // The template renders thinking before an earlier call: the prompt grows by it.
  const turn = (extra) => ({ ...base, max_tokens: 1, tools: TOOLS, messages: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: '', ...extra, tool_calls: [{ id: 'c1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'sunny' }] });
  const without = await client.chat.completions.create(turn({}));
  const withIt = await client.chat.completions.create(turn({ reasoning_content: 'I should look it up.' }));
  assert.ok(withIt.usage.prompt_tokens > without.usage.prompt_tokens + 5);
});

test('Anthropic: a thinking block before the text, streamed the same', async () => {
  const body = { model: 'm', max_tokens: 200, temperature: 0, grammar: THINK_THEN_ANSWER,
                 messages: [{ role: 'user', content: 'Weather in Paris?' }] };
  const msg = await anthropic.messages.create(body);
  assert.deepEqual(msg.content.map((b) => b.type), ['thinking', 'text']);
  assert.match(msg.content[0].thinking, /^[a-z]{2,12}$/);
  assert.match(msg.content[1].text, /^[a-z]{2,12}$/);
  const final = await anthropic.messages.stream(body).finalMessage();
  assert.deepEqual(final.content, msg.content);
});

test('Responses: a reasoning item before the message, streamed the same', async () => {
  const body = { model: 'm', input: 'Weather in Paris?', temperature: 0, max_output_tokens: 200, grammar: THINK_THEN_ANSWER };
  const r = await client.responses.create(body);
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
  assert.match(r.output[0].content[0].text, /^[a-z]{2,12}$/);
  assert.match(r.output_text, /^[a-z]{2,12}$/);
  assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);
  let done = null, reasoning = '';
  for await (const e of await client.responses.create({ ...body, stream: true })) {
    if (e.type === 'response.reasoning_text.delta') reasoning += e.delta;
    if (e.type === 'response.completed') done = e.response;
  }
  assert.equal(reasoning, r.output[0].content[0].text);
  const noIds = (items) => items.map(({ id, ...rest }) => rest);  // ids differ between responses
  assert.deepEqual(noIds(done.output), noIds(r.output));
});
