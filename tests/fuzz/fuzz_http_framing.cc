// libFuzzer target: bytes -> the requests one HttpServer connection reads from them, as
// its session does: each header parsed by Beast, its framing judged by FramingRefusal
// (common/http/http_framing.h), the body read as Beast frames it, then the next request.
// The invariants: no crash, hang or leak; and a request whose framing is accepted and
// that names a Transfer-Encoding is chunked, so that its body ends where its chunks end
// and no byte of it can be read as the next request. Each accepted request's target is
// also read as the APIs read it, by ParseQueryString (common/query_string.h): it returns
// at most kMaxQueryFields fields or throws QueryError, nothing else.
#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/http/http_framing.h"
#include "common/query_string.h"

namespace {

namespace http = boost::beast::http;

constexpr int kMostRequests = 64;

void ReadQuery(const boost::beast::string_view target) {
  try {
    if (trainyard::ParseQueryString({target.data(), target.size()}).size() > trainyard::kMaxQueryFields) std::abort();
  } catch (const trainyard::QueryError&) {
  }
}

// Feeds `rest` to `parser` until `done` says so: false when the connection would end
// there (a parse error, or bytes that run out first).
template <typename Done>
bool Feed(http::request_parser<http::string_body>& parser, boost::asio::const_buffer& rest, Done done) {
  while (!done()) {
    boost::beast::error_code error;
    const size_t used = parser.put(rest, error);
    rest += used;
    if (error || (used == 0 && !done())) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  boost::asio::const_buffer rest(data, size);
  for (int request = 0; request < kMostRequests && rest.size() > 0; ++request) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(64 * 1024);
    parser.body_limit(1 << 20);
    if (!Feed(parser, rest, [&] { return parser.is_header_done(); })) return 0;
    if (trainyard::FramingRefusal(parser)) return 0;  // answered and closed: nothing after the header is read
    if (parser.get().count(http::field::transfer_encoding) > 0 && !parser.chunked()) std::abort();
    ReadQuery(parser.get().target());
    if (!Feed(parser, rest, [&] { return parser.is_done(); })) return 0;
  }
  return 0;
}
