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
