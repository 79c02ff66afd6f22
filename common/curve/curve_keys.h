// Who may speak the wire: ZeroMQ CURVE keys and the two roles. Torch-free.
//
// Every socket of the coordinator, the workers and jobctl is encrypted and
// authenticated with CURVE (elliptic-curve keys, as in CurveZMQ). `coordinator --init`
// makes a key folder (0700) beside the state database:
//   coordinator.key  the coordinator's key pair (0600)
//   coordinator.pub  its public key: what workers and jobctl need to reach it
//   worker.key       the key pair worker ranks connect with (0600)
//   client.key       the key pair jobctl connects with (0600)
//   workers.allow    public keys allowed in the worker role, one a line
//   clients.allow    public keys allowed in the client role, one a line
// The coordinator's ZAP handler (coordinator/zap_handler.h) admits a peer only if its
// public key is on one of the two lists, and tags its messages with the role; the
// coordinator then refuses worker messages from a client key and client messages from a
// worker key. More keys can be allowed by adding their public keys to a list (a line
// "# comment" is ignored), for example one key pair per host or per user.
//
// `--insecure` (development only) turns CURVE off on every side; anyone who can reach
// the port can then do anything, which is why it has to be asked for by name.
#pragma once

#include <set>
#include <stdexcept>
#include <string>
#include <zmq.hpp>

namespace trainyard {

// A key file or folder that cannot be used: what() names the file and the fix.
class KeyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class WireRole { kWorker, kClient };
const char* ToString(WireRole role);

// Z85 text, 40 characters each.
struct CurveKeyPair {
  std::string public_key, secret_key;
};

CurveKeyPair NewCurveKeyPair();

// Creates `dir` with the files above. Throws KeyError if it already holds keys (they are
// never overwritten) or cannot be written.
void InitKeyDir(const std::string& dir);

// The coordinator's side: its key pair and the two allowlists.
struct ServerKeys {
  CurveKeyPair own;
  std::set<std::string> workers, clients;
};
ServerKeys LoadServerKeys(const std::string& dir);

// A worker's or jobctl's side: its key pair and the coordinator's public key.
struct PeerKeys {
  CurveKeyPair own;
  std::string server_public_key;
};
PeerKeys LoadPeerKeys(const std::string& dir, WireRole role);

// Set before bind/connect. The server side also needs a ZAP handler in its context.
void MakeCurveServer(zmq::socket_t& socket, const ServerKeys& keys);
void MakeCurveClient(zmq::socket_t& socket, const PeerKeys& keys);

// 128 random bits from the system's generator, as 32 hex digits: the rank and world
// tokens of a registration (see Register in trainyard.proto).
std::string NewSecretToken();

// The folder used when none is given: $TRAINYARD_KEYS, else "keys" (relative to the
// working directory).
std::string DefaultKeyDir();

}  // namespace trainyard
