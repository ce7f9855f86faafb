input-file-and-more-files =
    { $fileCount ->
        [one] and one more
       *[other] and { $fileCount } more
    }
form-post-secure-to-insecure-warning-title = Security Warning
form-post-secure-to-insecure-warning-message =
    The information you have entered on this page will be sent over an insecure connection and could be read by a third party.
    
    Are you sure you want to send this information?
form-post-secure-to-insecure-warning-continue = Continue
