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
//   clients.allow    public keys allowed in the client role, one a line, each with
//                    an optional user name and role: "<key> [<name> [user|admin]]"
// The coordinator's ZAP handler (coordinator/zap_handler.h) admits a peer only if its
// public key is on one of the two lists, and tags its messages with the role; the
// coordinator then refuses worker messages from a client key and client messages from a
// worker key. More keys can be allowed by adding their public keys to a list (a line
// "# comment" is ignored), for example one key pair per host or per user.
//
// Note [Client keys name users]
// A client key with a name on its clients.allow line acts as that user: the jobs it
// submits belong to the name, whatever jobctl says, and it may cancel only those,
// unless its role is admin. A key with a name and no role is a user. A key with no name
// is an admin and submits as the login name jobctl reports, as every key did before
// keys had names: a key folder made before then keeps working unchanged.
// `coordinator --add-client` makes a named key.
//
// `--insecure` (development only) turns CURVE off on every side; anyone who can reach
// the port can then do anything, which is why it has to be asked for by name.
#pragma once

#include <map>
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

// Who a client key acts as (Note [Client keys name users]).
struct ClientIdentity {
  std::string user;  // empty: a key with no name
  bool admin = true;
};

// What the ZAP handler tags a peer's messages with ("User-Id"): "worker:<public key>" for a
// worker key (`client.user` holds the key; "worker" without one), "client" for a client key
// with no name, "client:<name>:user" or "client:<name>:admin".
std::string ZapUserId(WireRole role, const ClientIdentity& client);
// ZapUserId's text back: the role ("worker", "client", or what else it was) and, for a
// client, who it acts as; for a worker, its public key in `client->user`.
void ParseZapUserId(const std::string& text, std::string* role, ClientIdentity* client);

// User names on clients.allow: 1 to 64 of letters, digits, '.', '_', '-' and '@'.
bool PlausibleUserName(const std::string& name);

// The coordinator's side: its key pair and the two allowlists.
struct ServerKeys {
  CurveKeyPair own;
  std::set<std::string> workers;
  std::map<std::string, ClientIdentity> clients;  // by public key
};
// Throws KeyError naming the file and line of anything it cannot use.
ServerKeys LoadServerKeys(const std::string& dir);

// Makes a client key pair for `user` with `role` ("user" or "admin"): writes
// `out_dir`/client.key (0600) and a copy of the coordinator's public key there, which is
// what jobctl --keys needs, and adds "<public key> <user> <role>" to `dir`/clients.allow.
// A running coordinator reads the list at start and again on SIGHUP. Throws KeyError.
void AddClientKey(const std::string& dir, const std::string& user, const std::string& role, const std::string& out_dir);

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
