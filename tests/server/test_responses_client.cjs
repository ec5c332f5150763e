// `tessera serve`'s Responses API (the stateless subset of POST /v1/responses) against
// the official OpenAI client's `responses.create` and `responses.stream`: a response
// equal to the chat endpoint's greedy answer, streaming events in order adding up to
// it, input items (messages with input_text/output_text parts, function_call and
// function_call_output) reaching the template as the fixture renders the conversation,
// a forced call's function_call item (the random-weights model writes a call only when
// its grammar makes it), and the refusals of what needs stored state. Exit code 77 =
// skipped.
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
  server = await h.startServer(['-m', MODEL, '--threads', '2', '--parallel', '4', '--ctx', '1100',
                                '--chat-template', TEMPLATE]);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (!server) return;
  const code = await server.stop();
  assert.equal(code, 0, 'the server did not shut down cleanly:\n' + server.stderr());
});

const SYSTEM = 'You are a terse assistant.';
const USER = 'Name a prime number.';
const greedy = { model: 'm', instructions: SYSTEM, input: USER, max_output_tokens: 16, temperature: 0 };

// A Response without what differs between two runs of the same request.
const stable = (r) => JSON.parse(JSON.stringify(r, (k, v) => (k === 'id' || k === 'created_at' ? undefined : v)));

test('a response: the chat endpoint\'s greedy answer as a Response object', async () => {
  const r = await client.responses.create(greedy);
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.model, 'llama-q8_0');
  assert.equal(r.instructions, SYSTEM);
  assert.equal(r.max_output_tokens, 16);
  assert.equal(r.store, false);
  assert.equal(r.output.length, 1);
  const item = r.output[0];
  assert.equal(item.type, 'message');
  assert.equal(item.role, 'assistant');
  assert.match(item.id, /^msg_/);
  assert.equal(item.content[0].type, 'output_text');
  assert.equal(r.output_text, item.content[0].text);  // the SDK's convenience field
  const chat = await client.chat.completions.create({ model: 'm', max_tokens: 16, temperature: 0,
    messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: USER }] });
  assert.equal(r.output_text, chat.choices[0].message.content);
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(r.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  if (chat.choices[0].finish_reason === 'length') {
    assert.equal(r.status, 'incomplete');
    assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
    assert.equal(item.status, 'incomplete');
  } else {
    assert.equal(r.status, 'completed');
    assert.equal(r.incomplete_details, null);
  }
  // The same conversation as input items (a system message and input_text parts).
  const items = await client.responses.create({ ...greedy, instructions: undefined, input: [
    { role: 'system', content: SYSTEM }, { role: 'user', content: [{ type: 'input_text', text: USER }] }] });
  assert.deepEqual({ ...stable(items), instructions: SYSTEM }, stable(r));
});

test('streaming: the Responses events in order, adding up to the whole response', async () => {
  const whole = await client.responses.create(greedy);
  const stream = await client.responses.create({ ...greedy, stream: true });
  const events = [];
  for await (const e of stream) events.push(e);
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  const runs = events.map((e) => e.type).filter((t, i, a) => t !== a[i - 1]);
  const end = whole.status === 'incomplete' ? 'response.incomplete' : 'response.completed';
  assert.deepEqual(runs, ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added', 'response.output_text.delta', 'response.output_text.done',
    'response.content_part.done', 'response.output_item.done', end]);
  assert.equal(events[0].response.status, 'in_progress');
  assert.deepEqual(events[0].response.output, []);
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(text, whole.output_text);
  const last = events[events.length - 1].response;
  assert.deepEqual(stable(last), stable({ ...whole, output_text: undefined }));
  // The SDK's accumulating stream gives the same text.
  const s = client.responses.stream(greedy);
  const deltas = [];
  s.on('response.output_text.delta', (e) => deltas.push(e.delta));
  const final = await s.finalResponse();  // (openai 4.95 sets no output_text on it)
  assert.equal(final.output.filter((o) => o.type === 'message').flatMap((o) => o.content).map((c) => c.text).join(''),
               whole.output_text);
  assert.equal(deltas.join(''), whole.output_text);
});

// The token count of a prompt text as the server tokenizes a rendered chat prompt.
function tokenCount(text) {
  const out = execFileSync(process.env.TESSERA_BIN, ['tokenize', '-m', MODEL, '--special', '--text', text], { encoding: 'utf8' });
  return out.trim().split(/\s+/).length;
}

test('function tools and call items reach the template as the fixture renders them', async () => {
  const expected = JSON.parse(fs.readFileSync(path.join(TEMPLATES, 'expected.json'), 'utf8'))['Qwen-Qwen3-0.6B'].cases;
  const tools = [{ type: 'function', name: 'get_weather', description: 'Current weather for a city.', strict: false,
                   parameters: { type: 'object', properties: { city: { type: 'string', description: 'City name' },
                                                               unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
                                 required: ['city'] } }];
  const input = [
    { role: 'user', content: 'Weather in Paris?' },
    { type: 'function_call', call_id: 'call12345', name: 'get_weather', arguments: JSON.stringify({ city: 'Paris', unit: 'celsius' }) },
    { type: 'function_call_output', call_id: 'call12345', output: '{"temp": 21, "sky": "clear"}' },
  ];
  const r = await client.responses.create({ model: 'm', input, tools, max_output_tokens: 8, temperature: 0 });
  assert.equal(r.usage.input_tokens, tokenCount(expected.tool_round_trip.text), 'the prompt differs from the template\'s rendering');
  assert.ok(r.output.every((o) => o.type === 'message'), 'the random-weights fixture writes no call');
  assert.deepEqual(r.tools, tools);
  const first = await client.responses.create({ model: 'm', instructions: 'You can call tools.', input: 'Weather in Paris?',
                                                tools, max_output_tokens: 8, temperature: 0, tool_choice: 'none' });
  assert.equal(first.usage.input_tokens, tokenCount(expected.tools.text));
  assert.equal(first.tool_choice, 'none');
});

test('a forced function call: a function_call item whose arguments fit the schema, whole and streamed', async () => {
  const tools = [{ type: 'function', name: 'get_weather', parameters: {
    type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 10 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'], additionalProperties: false } }];
  const input = [{ role: 'user', content: 'Weather in Paris?' }];
  const body = { model: 'm', input, tools, tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 300,
                 temperature: 0, parallel_tool_calls: false };
  const r = await client.responses.create(body);
  assert.equal(r.status, 'completed', JSON.stringify(r));
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1);
  const call = calls[0];
  assert.equal(call.name, 'get_weather');
  assert.match(call.id, /^fc_/);
  const args = JSON.parse(call.arguments);
  assert.ok(typeof args.city === 'string' && [...args.city].length >= 1 && [...args.city].length <= 10, call.arguments);
  assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7, call.arguments);
  const stream = await client.responses.create({ ...body, stream: true });
  const events = [];
  for await (const e of stream) events.push(e);
  const argDeltas = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  assert.equal(argDeltas, call.arguments);
  const last = events[events.length - 1];
  assert.equal(last.type, 'response.completed');
  const noIds = (x) => JSON.parse(JSON.stringify(x, (k, v) => (k === 'id' || k === 'created_at' || k === 'call_id' ? undefined : v)));
  assert.deepEqual(noIds(last.response), noIds({ ...r, output_text: undefined }));
  // The call and its output go back as items.
  const next = await client.responses.create({ model: 'm', tools, max_output_tokens: 8, temperature: 0, input: [
    ...input, { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
    { type: 'function_call_output', call_id: call.call_id, output: '21 C, clear' }] });
  assert.ok(next.usage.input_tokens > r.usage.input_tokens);
});

test('what needs stored state, and bad fields, are 400s naming the field', async () => {
  const cases = [
    [{ ...greedy, previous_response_id: 'resp_123' }, 'previous_response_id', /stateless/],
    [{ ...greedy, store: true }, 'store', /keeps no responses/],
    [{ ...greedy, max_output_tokens: 5000 }, 'max_output_tokens', /maximum context length/],
    [{ ...greedy, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:image/png;base64,AA==' }] }] },
     'input', /'input_image' are not supported/],
    [{ ...greedy, input: [{ type: 'function_call_output', call_id: 'nope', output: '1' }] }, 'input', /matches no earlier function_call/],
    [{ ...greedy, tools: [{ type: 'web_search_preview' }] }, 'tools', /hosted tools/],
    [{ ...greedy, tools: [{ type: 'function', name: 'f' }], tool_choice: { type: 'function', name: 'nope' } }, 'tool_choice', /nope/],
  ];
  for (const [body, param, says] of cases) {
    await assert.rejects(client.responses.create(body), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.param, param, e.message);
      assert.match(e.message, says);
      return true;
    });
  }
  // store: false (what the client sends to keep nothing) is accepted.
  assert.equal((await client.responses.create({ ...greedy, store: false })).store, false);
});
