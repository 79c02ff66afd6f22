#include "common/curve/curve_keys.h"

#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

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

// Each line's first word is a key; `read_rest` is given the line's other words.
template <typename ReadRest>
void ForEachAllowed(const fs::path& path, ReadRest read_rest) {
  std::ifstream in(path);
  if (!in) throw KeyError(path.string() + ": cannot be read; make the keys with `coordinator --init`");
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key.empty() || key[0] == '#') continue;
    const std::string where = path.string() + ":" + std::to_string(number);
    if (!IsZ85Key(key)) throw KeyError(where + ": expected a 40-character Z85 public key");
    std::vector<std::string> rest;
    for (std::string word; words >> word;) rest.push_back(word);
    read_rest(where, key, rest);
  }
}

std::set<std::string> ReadWorkerAllowlist(const fs::path& path) {
  std::set<std::string> keys;
  ForEachAllowed(path, [&](const std::string& where, const std::string& key, const std::vector<std::string>& rest) {
    if (!rest.empty()) throw KeyError(where + ": expected only a public key (worker keys have no user)");
    keys.insert(key);
  });
  return keys;
}

// "<key> [<name> [user|admin]]" lines (Note [Client keys name users]).
std::map<std::string, ClientIdentity> ReadClientAllowlist(const fs::path& path) {
  std::map<std::string, ClientIdentity> keys;
  ForEachAllowed(path, [&](const std::string& where, const std::string& key, const std::vector<std::string>& rest) {
    if (rest.size() > 2) throw KeyError(where + ": expected '<key> [<user name> [user|admin]]'");
    ClientIdentity who;
    if (!rest.empty()) {
      if (!PlausibleUserName(rest[0]))
        throw KeyError(where + ": user name '" + rest[0] + "': expected 1 to 64 letters, digits, '.', '_', '-' or '@'");
      who.user = rest[0];
      who.admin = false;
    }
    if (rest.size() == 2) {
      if (rest[1] != "user" && rest[1] != "admin")
        throw KeyError(where + ": role '" + rest[1] + "': expected user or admin");
      who.admin = rest[1] == "admin";
    }
    if (keys.count(key)) throw KeyError(where + ": key " + key + " is listed twice");
    keys[key] = who;
  });
  return keys;
}

void SetKey(zmq::socket_t& socket, int option, const std::string& z85) {
  if (zmq_setsockopt(socket.handle(), option, z85.c_str(), z85.size()) != 0)
    throw KeyError(std::string("ZeroMQ refused a CURVE key: ") + zmq_strerror(zmq_errno()));
}

}  // namespace

const char* ToString(WireRole role) { return role == WireRole::kWorker ? "worker" : "client"; }

bool PlausibleUserName(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '@';
  });
}

std::string ZapUserId(WireRole role, const ClientIdentity& client) {
  if (client.user.empty()) return ToString(role);
  if (role == WireRole::kWorker) return std::string(ToString(role)) + ":" + client.user;
  return std::string(ToString(role)) + ":" + client.user + ":" + (client.admin ? "admin" : "user");
}

void ParseZapUserId(const std::string& text, std::string* role, ClientIdentity* client) {
  const size_t first = text.find(':');
  *role = text.substr(0, first);
  *client = ClientIdentity{};
  if (first == std::string::npos) return;
  if (*role == ToString(WireRole::kWorker)) {  // a Z85 key may itself hold ':'
    *client = ClientIdentity{text.substr(first + 1), false};
    return;
  }
  const size_t second = text.find(':', first + 1);
  client->user = text.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  client->admin = second != std::string::npos && text.substr(second + 1) == "admin";
}

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
  keys.workers = ReadWorkerAllowlist(root / "workers.allow");
  keys.clients = ReadClientAllowlist(root / "clients.allow");
  for (const std::string& key : keys.workers)
    if (keys.clients.count(key))
      throw KeyError(dir + ": key " + key + " is in both workers.allow and clients.allow; a key has one role");
  return keys;
}

void AddClientKey(const std::string& dir, const std::string& user, const std::string& role,
                  const std::string& out_dir) {
  if (!PlausibleUserName(user))
    throw KeyError("user name '" + user + "': expected 1 to 64 letters, digits, '.', '_', '-' or '@'");
  if (role != "user" && role != "admin") throw KeyError("role '" + role + "': expected user or admin");
  const fs::path root(dir), out(out_dir);
  const std::map<std::string, ClientIdentity> listed = ReadClientAllowlist(root / "clients.allow");
  for (const auto& [key, who] : listed)
    if (who.user == user) throw KeyError(dir + "/clients.allow already has a key for user '" + user + "'");
  const std::string coordinator_public = ReadKeyFile(root / "coordinator.pub", false).public_key;
  std::error_code error;
  fs::create_directories(out, error);
  if (error) throw KeyError("cannot create " + out_dir + ": " + error.message());
  ::chmod(out.c_str(), 0700);
  const CurveKeyPair pair = NewCurveKeyPair();
  WriteNewFile(out / "client.key", PairText(pair), 0600);
  WriteNewFile(out / "coordinator.pub", "public " + coordinator_public + "\n", 0644);
  std::ofstream allow(root / "clients.allow", std::ios::app);
  allow << pair.public_key << " " << user << " " << role << "\n";
  allow.close();
  if (!allow) throw KeyError("cannot append to " + (root / "clients.allow").string());
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
