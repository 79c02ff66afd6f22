// fuzz_wire's input format, shared with its seed generator (wire_seeds.cc): a script
// of frames, each from one of a few peers, played against one fresh coordinator.
//   script := frame*
//   frame  := peer (1 byte, taken modulo kPeers) | length (2 bytes, little-endian) | payload
// A length running past the end takes what is left, so every byte string is a script.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainyard::fuzz {

// ZeroMQ routing ids: the job's two ranks, a client, and a stranger.
inline const char* const kPeers[] = {"rank-0", "rank-1", "client", "stranger"};
// Each peer's ZAP role: the ranks hold the worker key, "stranger" a client key used
// to send worker messages (and vice versa: every role check is in reach).
inline const char* const kPeerRoles[] = {"worker", "worker", "client", "client"};
// The tokens the seeds' ranks register with (any 32+ characters pass the format check).
inline constexpr const char* kWorldToken = "00112233445566778899aabbccddeeff";
inline const char* const kRankTokens[] = {"0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"};
constexpr int kPeerCount = 4;

// What the fuzzer's store holds before each script: job kJob (kJobRanks ranks) RUNNING
// as attempt kAttempt on ranks 0 and 1 of world kWorld, as a restarted coordinator
// finds it, so results, epochs and exits have an attempt to act on.
constexpr int64_t kJob = 1;
constexpr int kAttempt = 1;
constexpr char kWorld[] = "w";

struct Frame {
  int peer = 0;  // index into kPeers
  std::string payload;
};

inline std::vector<Frame> DecodeScript(const uint8_t* data, size_t size) {
  std::vector<Frame> frames;
  size_t at = 0;
  while (at < size) {
    Frame f;
    f.peer = data[at] % kPeerCount;
    size_t length = at + 1 < size ? data[at + 1] : 0;
    if (at + 2 < size) length |= size_t{data[at + 2]} << 8;
    at = std::min(at + 3, size);
    length = std::min(length, size - at);
    f.payload.assign(reinterpret_cast<const char*>(data) + at, length);
    at += length;
    frames.push_back(std::move(f));
  }
  return frames;
}

// REQUIRES: every payload is under 64 KiB.
inline std::string EncodeScript(const std::vector<Frame>& frames) {
  std::string out;
  for (const Frame& f : frames) {
    out += static_cast<char>(f.peer);
    out += static_cast<char>(f.payload.size() & 0xFF);
    out += static_cast<char>((f.payload.size() >> 8) & 0xFF);
    out += f.payload;
  }
  return out;
}

}  // namespace trainyard::fuzz
