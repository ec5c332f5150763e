// Structured output through the official OpenAI client: response_format json_schema
// and json_object, llama.cpp's `grammar`, and forced tool calls. The fixture model is
// random, so every answer here is what the grammar alone makes of random logits: the
// schemas bound every string and number so that each answer ends within max_tokens,
// and each answer is checked against its schema field by field.
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert');
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
  server = await h.startServer(['-m', MODEL, '--threads', '2', '--parallel', '4', '--ctx', '2048',
                                '--chat-template', TEMPLATE]);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => { if (server) assert.equal(await server.stop(), 0, server.stderr()); });

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 8 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    role: { enum: ['admin', 'user', 'guest'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 4 }, maxItems: 3 },
    active: { type: 'boolean' },
  },
  required: ['name', 'age', 'role'],
  additionalProperties: false,
};

function checkPerson(text) {
  const p = JSON.parse(text);  // throws if not JSON
  assert.deepEqual(Object.keys(p).filter((k) => !Object.hasOwn(PERSON.properties, k)), [], text);
  const order = Object.keys(PERSON.properties).filter((k) => Object.hasOwn(p, k));
  assert.deepEqual(Object.keys(p), order, 'properties in the schema\'s order: ' + text);
  assert.equal(typeof p.name, 'string', text);
  assert.ok([...p.name].length >= 1 && [...p.name].length <= 8, text);
  assert.ok(Number.isInteger(p.age) && p.age >= 0 && p.age <= 120, text);
  assert.ok(['admin', 'user', 'guest'].includes(p.role), text);
  if ('tags' in p) {
    assert.ok(Array.isArray(p.tags) && p.tags.length <= 3, text);
    for (const t of p.tags) assert.ok(typeof t === 'string' && [...t].length <= 4, text);
  }
  if ('active' in p) assert.equal(typeof p.active, 'boolean', text);
  return p;
}

const personFormat = { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: PERSON } };
const ask = { model: 'm', messages: [{ role: 'user', content: 'Describe someone.' }], max_tokens: 600 };

test('json_schema: sampled answers (several seeds at once) follow the schema and end by themselves', async () => {
  const seeds = [1, 2, 3, 4, 5, 6];
  const answers = await Promise.all(seeds.map((seed) =>
    client.chat.completions.create({ ...ask, seed, temperature: 1.0, response_format: personFormat })));
  for (const r of answers) {
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    checkPerson(r.choices[0].message.content);
  }
  // A seed gives the same answer again.
  const again = await client.chat.completions.create({ ...ask, seed: 3, temperature: 1.0, response_format: personFormat });
  assert.equal(again.choices[0].message.content, answers[2].choices[0].message.content);
});

test('json_schema: streaming gives the same text as one answer, greedy too', async () => {
  for (const temperature of [0, 0.7]) {
    const body = { ...ask, seed: 11, temperature, response_format: personFormat };
    const one = await client.chat.completions.create(body);
    let text = '', finish = null;
    for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
      const c = chunk.choices[0];
      if (c?.delta?.content) text += c.delta.content;
      if (c?.finish_reason) finish = c.finish_reason;
    }
    assert.equal(text, one.choices[0].message.content);
    assert.equal(finish, 'stop');
    checkPerson(text);
  }
});

test('json_object and grammar on completions', async () => {
  // A generic object is unbounded for a random model, so "}" is pushed far up: the
  // grammar still decides where it may go (first a "{", and nothing after the "}").
  const tok = await h.postJson(server.url + '/tokenize', { content: '}' });
  const close = tok.json.tokens[tok.json.tokens.length - 1];
  const body = { model: 'm', prompt: 'JSON:', max_tokens: 20, seed: 5, logit_bias: { [close]: 100 } };
  const free = await client.completions.create(body);
  assert.match(free.choices[0].text, /^}}}/);
  const r = await client.completions.create({ ...body, response_format: { type: 'json_object' } });
  assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].text);
  assert.deepEqual(JSON.parse(r.choices[0].text), {});
  for (const seed of [1, 2, 3]) {
    const g = await client.completions.create({ model: 'm', prompt: 'x', max_tokens: 50, seed, temperature: 1.2,
                                                grammar: 'root ::= ("yes" | "no") ", " [0-9]{2,3} " " [a-z]{1,5} "."' });
    assert.match(g.choices[0].text, /^(yes|no), [0-9]{2,3} [a-z]{1,5}\.$/);
    assert.equal(g.choices[0].finish_reason, 'stop');
  }
});

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', parameters: {
      type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 10 },
                                    days: { type: 'integer', minimum: 1, maximum: 7 },
                                    unit: { enum: ['celsius', 'fahrenheit'] } },
      required: ['city', 'days'], additionalProperties: false } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];

function checkCall(call) {
  assert.equal(call.type, 'function');
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_time') {
    assert.deepEqual(args, {});
    return;
  }
  assert.equal(call.function.name, 'get_weather');
  assert.ok(typeof args.city === 'string' && [...args.city].length >= 1 && [...args.city].length <= 10, call.function.arguments);
  assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7, call.function.arguments);
  if ('unit' in args) assert.ok(['celsius', 'fahrenheit'].includes(args.unit));
}

test('tool_choice required and named: the answer is a call whose arguments match the tool', async () => {
  const base = { model: 'm', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: TOOLS, max_tokens: 400 };
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({ ...base, seed, tool_choice: 'required', parallel_tool_calls: false });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.equal(c.message.tool_calls.length, 1);
    checkCall(c.message.tool_calls[0]);
  }
  for (const seed of [5, 6]) {
    const r = await client.chat.completions.create({ ...base, seed,
      tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.ok(c.message.tool_calls.length >= 1);
    for (const call of c.message.tool_calls) {
      assert.equal(call.function.name, 'get_weather');
      checkCall(call);
    }
  }
});

test('what cannot be enforced is a 400 naming the keyword', async () => {
  const cases = [
    [{ ...ask, response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true,
        schema: { type: 'integer', multipleOf: 3 } } } }, 'response_format', /multipleOf/],
    [{ ...ask, response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true,
        schema: { type: 'string', pattern: '(a)\\1' } } } }, 'response_format', /back-references/],
    [{ ...ask, grammar: 'root ::= undefined-rule' }, 'grammar', /undefined rule/],
    [{ ...ask, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice', /nope/],
  ];
  for (const [body, param, message] of cases) {
    await assert.rejects(client.chat.completions.create(body), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.error?.param ?? e.param, param);
      assert.match(e.message, message);
      return true;
    });
  }
  assert.equal((await fetch(server.url + '/health')).status, 200);
});
