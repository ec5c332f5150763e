// Anthropic's Messages API on the HTTP server: POST /v1/messages (whole or streamed
// with Anthropic's events) and POST /v1/messages/count_tokens, with the server's
// guarantees: 503 while loading, draining or when the queue is full, cancellation when
// the client goes away, the metrics' counters.
#pragma once

namespace httplib {
class Server;
}

namespace tessera::server {

class HttpApi;
void install_anthropic_routes(httplib::Server& server, const HttpApi& api);

}  // namespace tessera::server
