#include "common/curve/curve_keys.h"

#include <sys/stat.h>
#include <zmq.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr size_t kZ85KeyLength = 40;

bool IsZ85Key(const std::string& text) {
  if (text.size() != kZ85KeyLength) return false;
  uint8_t decoded[32];
  return zmq_z85_decode(decoded, text.c_str()) != nullptr;
}

// Writes `text` to a new file with `mode`; fails if the file exists.
void WriteNewFile(const fs::path& path, const std::string& text, mode_t mode) {
  if (fs::exists(path)) throw KeyError(path.string() + " already exists; keys are never overwritten");
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) throw KeyError("cannot write " + path.string());
  if (::chmod(path.c_str(), mode) != 0) throw KeyError("cannot set the permissions of " + path.string());
}

std::string PairText(const CurveKeyPair& pair) {
  return "public " + pair.public_key + "\nsecret " + pair.secret_key + "\n";
}

// Lines "public <z85>" and "secret <z85>" (the latter only in a key pair file).
CurveKeyPair ReadKeyFile(const fs::path& path, bool need_secret) {
  std::ifstream in(path);
  if (!in) throw KeyError(path.string() + ": cannot be read; make the keys with `coordinator --init`");
  if (need_secret) {
    struct stat info {};
    if (::stat(path.c_str(), &info) == 0 && (info.st_mode & 077) != 0)
      throw KeyError(path.string() + ": a secret key readable by other users is refused; chmod 600 it");
  }
  CurveKeyPair pair;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line);
    std::string kind, key;
    words >> kind >> key;
    if (kind.empty() || kind[0] == '#') continue;
    if ((kind != "public" && kind != "secret") || !IsZ85Key(key))
      throw KeyError(path.string() + ":" + std::to_string(number) +
                     ": expected 'public <key>' or 'secret <key>' with a 40-character Z85 key");
    (kind == "public" ? pair.public_key : pair.secret_key) = key;
  }
  if (pair.public_key.empty() || (need_secret && pair.secret_key.empty()))
    throw KeyError(path.string() + ": expected a " + (need_secret ? "'public' and a 'secret'" : "'public'") + " line");
  return pair;
}

std::set<std::string> ReadAllowlist(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw KeyError(path.string() + ": cannot be read; make the keys with `coordinator --init`");
  std::set<std::string> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key.empty() || key[0] == '#') continue;
    if (!IsZ85Key(key))
      throw KeyError(path.string() + ":" + std::to_string(number) + ": expected a 40-character Z85 public key");
    keys.insert(key);
  }
  return keys;
}

void SetKey(zmq::socket_t& socket, int option, const std::string& z85) {
  if (zmq_setsockopt(socket.handle(), option, z85.c_str(), z85.size()) != 0)
    throw KeyError(std::string("ZeroMQ refused a CURVE key: ") + zmq_strerror(zmq_errno()));
}

}  // namespace

const char* ToString(WireRole role) { return role == WireRole::kWorker ? "worker" : "client"; }

CurveKeyPair NewCurveKeyPair() {
  char public_key[kZ85KeyLength + 1], secret_key[kZ85KeyLength + 1];
  if (zmq_curve_keypair(public_key, secret_key) != 0)
    throw KeyError("this libzmq cannot make CURVE keys (built without libsodium?)");
  return {public_key, secret_key};
}

void InitKeyDir(const std::string& dir) {
  const fs::path root(dir);
  if (fs::exists(root / "coordinator.key"))
    throw KeyError(dir + " already holds keys; they are never overwritten (remove the folder to start over)");
  std::error_code error;
  fs::create_directories(root, error);
  if (error) throw KeyError("cannot create " + dir + ": " + error.message());
  ::chmod(root.c_str(), 0700);
  const CurveKeyPair coordinator = NewCurveKeyPair(), worker = NewCurveKeyPair(), client = NewCurveKeyPair();
  WriteNewFile(root / "coordinator.key", PairText(coordinator), 0600);
  WriteNewFile(root / "coordinator.pub", "public " + coordinator.public_key + "\n", 0644);
  WriteNewFile(root / "worker.key", PairText(worker), 0600);
  WriteNewFile(root / "client.key", PairText(client), 0600);
  WriteNewFile(root / "workers.allow", "# public keys of worker ranks\n" + worker.public_key + "\n", 0644);
  WriteNewFile(root / "clients.allow", "# public keys of jobctl users\n" + client.public_key + "\n", 0644);
}

ServerKeys LoadServerKeys(const std::string& dir) {
  const fs::path root(dir);
  ServerKeys keys;
  keys.own = ReadKeyFile(root / "coordinator.key", true);
  keys.workers = ReadAllowlist(root / "workers.allow");
  keys.clients = ReadAllowlist(root / "clients.allow");
  for (const std::string& key : keys.workers)
    if (keys.clients.count(key))
      throw KeyError(dir + ": key " + key + " is in both workers.allow and clients.allow; a key has one role");
  return keys;
}

PeerKeys LoadPeerKeys(const std::string& dir, WireRole role) {
  const fs::path root(dir);
  PeerKeys keys;
  keys.own = ReadKeyFile(root / (role == WireRole::kWorker ? "worker.key" : "client.key"), true);
  keys.server_public_key = ReadKeyFile(root / "coordinator.pub", false).public_key;
  return keys;
}

void MakeCurveServer(zmq::socket_t& socket, const ServerKeys& keys) {
  socket.set(zmq::sockopt::curve_server, 1);
  SetKey(socket, ZMQ_CURVE_SECRETKEY, keys.own.secret_key);
  socket.set(zmq::sockopt::zap_domain, "trainyard");
}

void MakeCurveClient(zmq::socket_t& socket, const PeerKeys& keys) {
  SetKey(socket, ZMQ_CURVE_SERVERKEY, keys.server_public_key);
  SetKey(socket, ZMQ_CURVE_PUBLICKEY, keys.own.public_key);
  SetKey(socket, ZMQ_CURVE_SECRETKEY, keys.own.secret_key);
}

std::string NewSecretToken() {
  std::random_device random;  // /dev/urandom on Linux
  char text[33];
  std::snprintf(text, sizeof text, "%08x%08x%08x%08x", random(), random(), random(), random());
  return text;
}

std::string DefaultKeyDir() {
  const char* env = std::getenv("TRAINYARD_KEYS");
  return env && *env ? env : "keys";
}

}  // namespace trainyard
