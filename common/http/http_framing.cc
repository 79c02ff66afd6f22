#include "common/http/http_framing.h"

#include <iterator>

namespace trainyard {

namespace http = boost::beast::http;

std::optional<FramingError> FramingRefusal(const http::request_parser<http::string_body>& parser) {
  const auto& message = parser.get();
  const auto codings = message.equal_range(http::field::transfer_encoding);
  const auto fields = std::distance(codings.first, codings.second);
  if (fields == 0) return std::nullopt;
  if (fields > 1) return FramingError{400, "Transfer-Encoding: given more than once"};
  if (!parser.chunked())
    return FramingError{400, "Transfer-Encoding: only a final chunked coding frames a request body"};
  const std::string value(codings.first->value());
  if (value.find(',') != std::string::npos)
    return FramingError{501, "Transfer-Encoding: only chunked is supported, without other codings"};
  if (message.find(http::field::content_length) != message.end())
    return FramingError{400, "a request may not carry both Transfer-Encoding and Content-Length"};
  return std::nullopt;
}

}  // namespace trainyard
