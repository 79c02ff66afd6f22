// HttpServer over real sockets on 127.0.0.1: a request is answered; a request framed by
// anything but one final chunked Transfer-Encoding is refused and its connection closed,
// so that its body is never read as a second request; and a server destroyed while a
// handler blocks ends that handler (client_gone() turns true) and joins every thread
// before its memory goes; under ASan (scripts/test_sanitized.sh) a thread that outlived
// it would be a use after free.
#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace trainyard {
namespace {

// A connected TCP socket to 127.0.0.1:port; -1 on failure.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    sent += static_cast<size_t>(n);
  }
}

// What the server sends until it closes the connection or `until` appears.
std::string ReadUntil(int fd, const std::string& until) {
  std::string got;
  char buffer[4096];
  while (got.find(until) == std::string::npos) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    got.append(buffer, static_cast<size_t>(n));
  }
  return got;
}

TEST(HttpServer, AnswersARequest) {
  HttpServer server({}, [](const HttpRequest& request, const std::function<bool()>&) {
    HttpResponse response;
    response.body = "{\"path\":\"" + request.target + "\"}";
    return response;
  });
  server.Start();
  const int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /v2/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string reply = ReadUntil(fd, "}");
  ::close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_NE(reply.find("{\"path\":\"/v2/health\"}"), std::string::npos) << reply;
}

// Counts the requests its handler sees and answers each with its target.
struct CountingServer {
  std::shared_ptr<std::atomic<int>> handled = std::make_shared<std::atomic<int>>(0);
  HttpServer server{{}, [handled = handled](const HttpRequest& request, const std::function<bool()>&) {
                      ++*handled;
                      HttpResponse response;
                      response.body = "{\"path\":\"" + request.target + "\"}";
                      return response;
                    }};
  CountingServer() { server.Start(); }
};

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The body that a server which trusts the wrong framing would run as a second request.
constexpr char kSmuggled[] = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

TEST(HttpServer, ARequestFramedByAnythingButAFinalChunkedCodingIsRefusedAndItsConnectionClosed) {
  const std::vector<std::pair<std::string, std::string>> framings = {
      {"Transfer-Encoding: gzip\r\n", "400"},
      {"Transfer-Encoding: identity\r\n", "400"},
      {"Transfer-Encoding: xchunked\r\n", "400"},
      {"Transfer-Encoding: chunked, gzip\r\n", "400"},
      {"Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n", "400"},
      {"Transfer-Encoding: gzip, chunked\r\n", "501"},
      {"Transfer-Encoding: chunked\r\nContent-Length: 40\r\n", "400"},
  };
  for (const auto& [headers, status] : framings) {
    CountingServer counting;
    const int fd = Connect(counting.server.port());
    ASSERT_GE(fd, 0);
    SendAll(fd, "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n" + kSmuggled);
    const std::string reply = ReadUntil(fd, "a reply that never comes: read until the server closes");
    ::close(fd);
    EXPECT_EQ(reply.rfind("HTTP/1.1 " + status, 0), 0u) << headers << reply;
    EXPECT_EQ(Count(reply, "HTTP/1.1 "), 1u) << headers << "a second answer means the body ran as a request:\n"
                                             << reply;
    EXPECT_EQ(reply.find("/smuggled"), std::string::npos) << headers << reply;
    EXPECT_EQ(*counting.handled, 0) << headers;
  }
}

TEST(HttpServer, AChunkedRequestAndTheRequestPipelinedAfterItAreBothAnswered) {
  CountingServer counting;
  const int fd = Connect(counting.server.port());
  ASSERT_GE(fd, 0);
  SendAll(fd,
          "POST /first HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
          "GET /second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string reply = ReadUntil(fd, "{\"path\":\"/second\"}");
  ::close(fd);
  EXPECT_EQ(Count(reply, "HTTP/1.1 200"), 2u) << reply;
  EXPECT_NE(reply.find("{\"path\":\"/first\"}"), std::string::npos) << reply;
  EXPECT_EQ(*counting.handled, 2);
}

TEST(HttpServer, DestroyedWhileAHandlerBlocksEndsItAndJoinsEveryThread) {
  auto entered = std::make_shared<std::atomic<bool>>(false);
  auto saw_gone = std::make_shared<std::atomic<bool>>(false);
  auto server = std::make_unique<HttpServer>(
      HttpServerOptions{}, [entered, saw_gone](const HttpRequest&, const std::function<bool()>& client_gone) {
        *entered = true;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!client_gone() && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        *saw_gone = client_gone();
        return HttpResponse{};
      });
  server->Start();
  const int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  SendAll(fd, "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  for (int i = 0; i < 2000 && !*entered; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(*entered) << "the handler never ran";
  const auto start = std::chrono::steady_clock::now();
  server.reset();  // the handler is still blocked in here
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(*saw_gone) << "the handler was not told its client is gone";
  EXPECT_LT(seconds, 10.0) << "destroying the server waited for the handler's own deadline";
  EXPECT_EQ(ReadUntil(fd, "\r\n\r\n"), "") << "a connection of a destroyed server still answered";
  ::close(fd);
}

}  // namespace
}  // namespace trainyard
