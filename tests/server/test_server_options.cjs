// Server options: the API key, a full queue (503), the health check, and a chat
// request for a model without a template. Exit code 77 = skipped.
'use strict';
const { test } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const h = require('./server_helpers.cjs');

const why = h.missing();
if (why) {
  console.log('SKIP: ' + why);
  process.exit(77);
}
const MODEL = path.join(h.FIXTURES, 'models', 'llama-q8_0.gguf');

test('--api-key: 401 without or with a wrong key, /health open', async () => {
  const s = await h.startServer(['-m', MODEL, '--threads', '1', '--api-key', 'sekret']);
  try {
    let r = await h.postJson(s.url + '/v1/completions', { prompt: 'x', max_tokens: 2 });
    assert.equal(r.status, 401);
    assert.equal(r.json.error.code, 'invalid_api_key');
    r = await h.postJson(s.url + '/v1/completions', { prompt: 'x', max_tokens: 2 }, { authorization: 'Bearer wrong' });
    assert.equal(r.status, 401);
    r = await h.postJson(s.url + '/v1/completions', { prompt: 'x', max_tokens: 2 }, { authorization: 'Bearer sekret' });
    assert.equal(r.status, 200, r.text);
    assert.equal((await fetch(s.url + '/health')).status, 200);
    assert.equal((await fetch(s.url + '/v1/models')).status, 401);
  } finally {
    const code = await s.stop();
    assert.equal(code, 0, 'the server did not shut down cleanly:\n' + s.stderr());
  }
});

test('a chat request for a model without a template is a 400', async () => {
  const s = await h.startServer(['-m', MODEL, '--threads', '1']);
  try {
    const r = await h.postJson(s.url + '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(r.status, 400);
    assert.equal(r.json.error.code, 'chat_template_missing');
  } finally {
    const code = await s.stop();
    assert.equal(code, 0, 'the server did not shut down cleanly:\n' + s.stderr());
  }
});

test('--queue: requests beyond the running ones and the queue get 503', async () => {
  const s = await h.startServer(['-m', MODEL, '--threads', '1', '--parallel', '1', '--queue', '1']);
  try {
    const body = { prompt: 'x', max_tokens: 150, temperature: 0, ignore_eos: true };
    const all = await Promise.all(Array.from({ length: 6 }, () => h.postJson(s.url + '/v1/completions', body)));
    const statuses = all.map((r) => r.status);
    assert.ok(statuses.includes(503), 'no 503: ' + statuses);
    assert.ok(statuses.includes(200), 'no 200: ' + statuses);
    for (const r of all.filter((r) => r.status === 503)) assert.equal(r.json.error.code, 'queue_full');
  } finally {
    const code = await s.stop();
    assert.equal(code, 0, 'the server did not shut down cleanly:\n' + s.stderr());
  }
});

test('a conversation the template refuses is a 400 with its message', async () => {
  const tmpl = path.join(h.FIXTURES, 'chat_templates', 'templates', 'google-gemma-2-2b-it.jinja');
  const s = await h.startServer(['-m', MODEL, '--threads', '1', '--chat-template', tmpl]);
  try {
    const r = await h.postJson(s.url + '/v1/chat/completions',
                               { messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'hi' }] });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.code, 'chat_template_error');
    assert.match(r.json.error.message, /System role not supported/);
    const ok = await h.postJson(s.url + '/v1/chat/completions',
                                { messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
    assert.equal(ok.status, 200, ok.text);
  } finally {
    const code = await s.stop();
    assert.equal(code, 0, 'the server did not shut down cleanly:\n' + s.stderr());
  }
});

test('--spec ngram: greedy answers equal plain ones, per-request speculative.n_max, /metrics counts drafts', async () => {
  // qwen3-q4_k_m's greedy output repeats itself, so n-gram lookup drafts and is accepted.
  const model = path.join(h.FIXTURES, 'models', 'qwen3-q4_k_m.gguf');
  const plain = await h.startServer(['-m', model, '--threads', '1']);
  const body = { prompt: [5, 6, 7, 8, 9], max_tokens: 60, temperature: 0, ignore_eos: true };
  let expected;
  try {
    const r = await h.postJson(plain.url + '/v1/completions', body);
    assert.equal(r.status, 200, r.text);
    expected = r.json.choices[0].text;
    const refused = await h.postJson(plain.url + '/v1/completions', { ...body, 'speculative.n_max': 4 });
    assert.equal(refused.status, 400, refused.text);
    assert.equal(refused.json.error.param, 'speculative.n_max');
  } finally {
    assert.equal(await plain.stop(), 0, plain.stderr());
  }
  const s = await h.startServer(['-m', model, '--threads', '1', '--parallel', '4', '--spec', 'ngram']);
  try {
    const answers = await Promise.all([
      h.postJson(s.url + '/v1/completions', body),
      h.postJson(s.url + '/v1/completions', { ...body, 'speculative.n_max': 0 }),
      h.postJson(s.url + '/v1/completions', { ...body, 'speculative.n_max': 3 }),
    ]);
    for (const r of answers) {
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.choices[0].text, expected);
    }
    assert.ok(await h.metric(s.url, 'tessera_spec_drafted_tokens_total') > 0, 'nothing drafted');
    assert.ok(await h.metric(s.url, 'tessera_spec_accepted_tokens_total') > 0, 'nothing accepted');
    const bad = await h.postJson(s.url + '/v1/completions', { ...body, 'speculative.n_max': 65 });
    assert.equal(bad.status, 400, bad.text);
  } finally {
    assert.equal(await s.stop(), 0, s.stderr());
  }
});

test('/tokenize and /detokenize: llama.cpp fields, round trip, pieces, errors', async () => {
  const s = await h.startServer(['-m', MODEL, '--threads', '1']);
  try {
    const text = 'Hello world, hello tokens';
    let r = await h.postJson(s.url + '/tokenize', { content: text });
    assert.equal(r.status, 200, r.text);
    const ids = r.json.tokens;
    assert.ok(ids.length > 0 && ids.every(Number.isInteger), r.text);
    // The same ids a completion's prompt gets (no BOS unless asked for).
    r = await h.postJson(s.url + '/tokenize', { content: text, add_special: true });
    assert.ok(r.json.tokens.length >= ids.length, r.text);
    r = await h.postJson(s.url + '/detokenize', { tokens: ids });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.content, text);
    r = await h.postJson(s.url + '/tokenize', { content: text, with_pieces: true });
    assert.deepEqual(r.json.tokens.map((t) => t.id), ids);
    assert.equal(r.json.tokens.map((t) => t.piece).join('').trim(), text);
    // Errors name the field.
    r = await h.postJson(s.url + '/tokenize', { content: 5 });
    assert.equal(r.status, 400);
    assert.equal(r.json.error.param, 'content');
    r = await h.postJson(s.url + '/detokenize', { tokens: [1, 1e9] });
    assert.equal(r.status, 400);
    assert.equal(r.json.error.param, 'tokens');
    r = await h.postJson(s.url + '/detokenize', { tokens: 'x' });
    assert.equal(r.status, 400);
  } finally {
    assert.equal(await s.stop(), 0, s.stderr());
  }
});
