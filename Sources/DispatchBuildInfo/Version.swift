/// What `dispatchd --version` and `dispatch --version` print: the release and the git commit
/// the binary was built from (recorded by the EmbedFiles plugin, see `Build.gitcommit`).
public enum Version {
    public static let release = "0.2.0"
    public static var commit: String { Build.commit }
    /// `0.2.0 (commit 1a2b3c4d5e6f)`.
    public static var description: String { "\(release) (commit \(String(commit.prefix(12))))" }
}
