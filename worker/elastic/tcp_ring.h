// Note [The replica ring]
// The replicas of an elastic job exchange gradients on a ring of TCP connections that is
// formed again for every membership, since an MPI world (Open MPI 4.1) cannot lose a
// member and go on. Each replica listens once (RingListener) and keeps that port for
// its life; a membership lists the members' addresses in ring order with an epoch that
// grows with every change. Forming it, member i connects to member i+1 and accepts
// member i-1's connection, both within the timeout.
//
// Handshake, the same at both ends of a connection: each sends the magic "TYRING1\0"
// and a random 16-byte nonce, then its hello (epoch, ring size, its position) with
// HMAC-SHA256 of (the peer's nonce, that hello) under the job's secret. A hello whose
// MAC does not verify, or that names another epoch, size or position than this end
// expects, is refused: the connection is closed and the acceptor waits on for the
// right one. So a process without the secret cannot join, a replayed handshake fails
// on the fresh nonce, and a replica that comes back with an old membership (a
// partition healed, a process resumed after SIGSTOP) cannot join a newer ring. (A
// connection that says nothing holds the acceptor until the timeout: the ring is then
// not formed, and the members try again.)
//
// All-reduce (sum, float32) is the ring algorithm: the buffer is cut into `size` chunks;
// in size-1 steps of reduce-scatter each member sends one chunk to the next and adds
// the one it receives from the previous, after which member i holds the total of chunk
// i+1; in size-1 steps of all-gather those totals travel once round the ring. Each
// member sends and receives 2(size-1)/size of the buffer, and every member ends with
// the same bits (the totals are copied, not summed again). Broadcast passes bytes along
// the ring from the root.
//
// Failure: every operation has a deadline (the timeout from its start), the only thing
// that catches a member that is alive but frozen. Connections also carry
// TCP_USER_TIMEOUT (sent data unacknowledged that long fails the socket: a host gone
// while we send) and keepalive probes every second (a half-open connection while we
// only receive). A closed or reset connection fails at once. Any of these throws
// RingFailure naming the neighbour whose connection failed and how; the ring is then
// unusable, and the survivors form a new one with a new epoch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainyard {

// Where a member of a ring listens.
struct RingMember {
  std::string host;
  int port = 0;
};

// An operation of the ring could not complete: `neighbour` is the ring position of the
// member whose connection failed (closed, reset, silent past the deadline, or refused at
// the handshake).
class RingFailure : public std::runtime_error {
 public:
  RingFailure(int neighbour, const std::string& what) : std::runtime_error(what), neighbour_(neighbour) {}
  int neighbour() const { return neighbour_; }

 private:
  int neighbour_;
};

// A replica's listening socket, kept across memberships. Binds `host` (loopback by
// default) on `port` (0: one the kernel picks).
class RingListener {
 public:
  explicit RingListener(const std::string& host = "127.0.0.1", int port = 0);
  ~RingListener();
  RingListener(const RingListener&) = delete;
  RingListener& operator=(const RingListener&) = delete;
  int port() const { return port_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct RingOptions {
  double timeout_s = 30;  // to form the ring, and for each operation
  std::string secret;     // the job's; both ends of every connection prove they hold it
};

class TcpRing {
 public:
  // Forms the ring of `members` (ring order) for membership `epoch`, as member
  // `position` (Note [The replica ring]). Throws RingFailure if a neighbour does not
  // complete the handshake within the timeout, std::invalid_argument for a position
  // outside the members or an empty secret.
  TcpRing(RingListener& listener, std::vector<RingMember> members, int position, uint64_t epoch, RingOptions options);
  ~TcpRing();
  TcpRing(const TcpRing&) = delete;
  TcpRing& operator=(const TcpRing&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  int position() const { return position_; }
  uint64_t epoch() const { return epoch_; }
  // Connections the acceptor refused while forming the ring (a wrong secret, epoch or
  // position).
  int refused() const { return refused_; }

  // Sums `count` floats (the same count on every member) over the ring, in place.
  void AllReduceSum(float* data, size_t count);
  // `bytes` of member `root` (the same size on every member) to every member.
  void Broadcast(void* bytes, size_t size, int root);

 private:
  int Next() const { return (position_ + 1) % size(); }
  int Previous() const { return (position_ + size() - 1) % size(); }
  void Form(RingListener& listener);
  // Sends `send_size` bytes to the next member while receiving `receive_size` from the
  // previous one, before `deadline` (steady seconds).
  void Exchange(const void* send, size_t send_size, void* receive, size_t receive_size, double deadline);
  [[noreturn]] void Fail(int fd, const std::string& what) const;

  std::vector<RingMember> members_;
  int position_ = 0;
  uint64_t epoch_ = 0;
  RingOptions options_;
  int next_fd_ = -1;      // to the next member
  int previous_fd_ = -1;  // from the previous member
  int refused_ = 0;
};

}  // namespace trainyard
