// How a request's body is framed, decided from its header before the body is read
// (RFC 9112 section 6.1). Shared by HttpServer and the fuzz_http_framing target.
//
// A request whose body length rests on anything but one Transfer-Encoding field that
// ends in `chunked` cannot be framed reliably, and whatever follows its header could be
// read as another request (smuggling, behind a proxy that frames it differently). Such a
// request is answered 400, or 501 for a coding this server does not decode, and its
// connection closed.
#pragma once

#include <boost/beast/http.hpp>
#include <optional>
#include <string>

namespace trainyard {

struct FramingError {
  int status = 400;
  std::string message;
};

// Why the request whose header `parser` has read cannot be framed safely; nothing when
// its framing is sound.
std::optional<FramingError> FramingRefusal(
    const boost::beast::http::request_parser<boost::beast::http::string_body>& parser);

}  // namespace trainyard
